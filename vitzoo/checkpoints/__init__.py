"""Checkpoints as files: reading a file, directory or Hub repo into `vitzoo.weights.ConvertedWeights`,
and writing and pushing vitzoo's own format. The tensors are converted by `vitzoo.weights`.

    sources      reading a file, directory or Hub repo, converted by the registered format that
                 recognises it
    native       save_pretrained's directory (config.json, model.safetensors, README.md), written and read
    card         the model card README.md that save_pretrained writes
    publish      pushing save_pretrained's directory (or a model, saved first) to the Hub
    hub          the Hub through huggingface_hub: pull into its cache (hashes checked), push a folder
    layouts      the layout a model is written in: timm's or transformers' config keys and tensor names
                 where that library builds the model (so that it loads the push), else vitzoo's own

Nothing here imports the model (`vitzoo.model` imports `native` and `publish` for its save and push).
"""
