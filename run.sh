#!/usr/bin/env bash
# vitzoo's one entry point.  ./run.sh main  - set up, then run the main job
#                            ./run.sh test  - set up, then run the full test suite
#                            ./run.sh setup - only set up (virtual environment in .venv)
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
PY=$VENV/bin/python

setup() {
    # Re-install only when what the install depends on has changed.
    local stamp
    stamp=$(cat run.sh pyproject.toml plugins/*/pyproject.toml 2>/dev/null | sha256sum | cut -d' ' -f1)
    if [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$stamp" ]; then
        return
    fi
    echo "== setting up $VENV (first run: a few minutes)"
    python3 -m venv "$VENV"
    # These exact releases lie on this machine's disk; an open range would download a multi-GB build.
    "$PY" -m pip install -q torch==2.14.1 torchvision==0.29.1
    "$PY" -m pip install -q -e ".[test,bench]"
    # the example plugins, installed as any third-party plugin would be (entry-point group "vitzoo")
    for plugin in plugins/*/; do
        if [ -f "$plugin/pyproject.toml" ]; then "$PY" -m pip install -q --no-deps -e "$plugin"; fi
    done
    # the real Fashion-MNIST, from Debian (used by training, tests and the benchmarks)
    if ! dpkg -s dataset-fashion-mnist >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ]; then
            apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null
        else
            echo "note: install Fashion-MNIST with: sudo apt-get install dataset-fashion-mnist" >&2
        fi
    fi
    echo "$stamp" > "$VENV/.setup-stamp"
}

test_workers() {
    local cores
    cores=$(nproc 2>/dev/null || echo 2)
    echo $(( cores + 1 < 4 ? cores + 1 : 4 ))
}

main_job() {
    # Table 8's headline on real Fashion-MNIST (no position embedding vs learned 1-D, two seeds each, in
    # two one-thread processes): about 3 minutes on 2 cores (3.1 measured). The table beside the paper's numbers and the
    # verdict are printed; results and figure go to runs/main. Every ablation at the CPU scale (hours):
    # .venv/bin/python -m benchmarks all --workers 2
    "$PY" -m benchmarks pos_embed --scale main --workers 2 --out runs/main "$@"
}

case "${1:-}" in
    setup) setup ;;
    main) setup; shift; main_job "$@" ;;
    # pytest-xdist workers: one more than the cores (at most 4), since tests wait on processes, servers and
    # timeouts a third of the time (2 cores: 962 s with 2 workers, 773 s with 3); each test module whole on
    # one worker (its fixtures are built once); `-n 0` runs in one process
    test) setup; shift; "$PY" -m pytest -q -n "$(test_workers)" --dist loadfile --no-loadscope-reorder "$@" ;;
    *) echo "usage: ./run.sh main | test [pytest args] | setup" >&2; exit 2 ;;
esac
