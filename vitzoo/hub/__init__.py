"""The Hugging Face Hub, through huggingface_hub: transport, its settings, its errors, its cache.

    settings     the server, offline mode, the token, the timeout: read at every call
    explain      huggingface_hub's and the network's errors as `HubError`s naming the cause and the fix
    cache        verifying and repairing the Hugging Face cache (files damaged on disk, partial downloads)
    deadline     how long a request, and a call, may wait for the server
    transport    pulling a model repo into the cache, pushing a folder as one commit

What a model repo holds, and saving a model to push it, are the checkpoints' (the file names in
`vitzoo.weights.layout`, the push in `vitzoo.checkpoints.publish`): the Hub moves files and knows no model.
"""
