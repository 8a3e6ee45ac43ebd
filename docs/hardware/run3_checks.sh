#!/usr/bin/env bash
# Session 3 on a lent 2x H200 machine: the start-up changes (setpriv spawn, the /bin/sh
# guardian stage, the lighter forked probe) proven on a real NVIDIA host. From the repo root:
#
#     OUT=/some/dir bash docs/hardware/run3_checks.sh checks   # probe, DDP, restart, kill -9
#     OUT=/some/dir bash docs/hardware/run3_checks.sh tests    # the whole suite
#     OUT=/some/dir bash docs/hardware/run3_checks.sh bench    # start-up figures
#
# Logs go to $OUT/run3/ and are packed into $OUT/run3.tar.gz (the device returns few files).
set -u
cd "$(dirname "$0")/../.." || exit 2
: "${OUT:?set OUT}"
mkdir -p "$OUT/run3"
LOGS=$OUT/run3
source docs/hardware/gpu_env.sh >"$LOGS/env_$1.log" 2>&1
export PYTHONPATH=$PWD/src
PYBIN=$(command -v python3)
# The console script pip would write, beside the image's python3 (the tests and the bench run
# `xpulaunch` as users do).
printf '#!%s\nimport sys\nfrom xpulaunch.cli.main import console_main\nsys.exit(console_main())\n' \
    "$PYBIN" >"$(dirname "$PYBIN")/xpulaunch"
chmod +x "$(dirname "$PYBIN")/xpulaunch"
{
    nvidia-smi -L; python3 -V; setpriv --version; readlink -f /bin/sh; uname -r
    python3 -c 'from xpulaunch.processes.spawn import _setpriv; print("setpriv used:", _setpriv())'
} >>"$LOGS/env_$1.log" 2>&1
case $1 in
checks)
    OUT=$LOGS timeout 200 bash docs/hardware/probe_check.sh >/dev/null 2>&1
    echo "probe_check exit $?" >>"$LOGS/summary.log"
    OUT=$LOGS timeout 300 bash docs/hardware/train_check.sh >/dev/null 2>&1
    echo "train_check exit $?" >>"$LOGS/summary.log"
    ;;
tests)
    pip_gguf=$(ls .device-carry/gguf-*.whl 2>/dev/null | head -1)
    [ -n "$pip_gguf" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/xpulaunch-site "$pip_gguf"
    XPULAUNCH_SKIP_LLAMA_TESTS=1 timeout 540 python3 -m pytest -q -p no:cacheprovider \
        tests tests_gpu >"$LOGS/tests_full_suite.log" 2>&1
    echo "pytest exit $?" >>"$LOGS/summary.log"
    ;;
bench)
    timeout 400 python3 bench/bench_supervisor.py >"$LOGS/bench_supervisor.log" 2>&1
    echo "bench_supervisor exit $?" >>"$LOGS/summary.log"
    timeout 150 python3 bench/bench_probe.py --runs 30 >"$LOGS/bench_probe.log" 2>&1
    echo "bench_probe exit $?" >>"$LOGS/summary.log"
    ;;
esac
cat "$LOGS/summary.log"
tail -n 4 "$LOGS"/*.log
tar -C "$OUT" -czf "$OUT/run3_$1.tar.gz" run3 && rm -rf "$LOGS"
