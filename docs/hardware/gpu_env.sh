#!/usr/bin/env bash
# Source this on a lent GPU machine (offline) before the *_check.sh scripts: it installs the
# wheels carried in .whl/ for whatever the image's python3 (3.12) lacks, through a .pth file so that
# scripts which set PYTHONPATH still see them, and exports the NVLS-off settings.
PY=${PYTHON:-python3}
SITE=/tmp/xpulaunch-site
mkdir -p "$SITE"
for pair in click:click psutil:psutil pynvml:nvidia_ml_py pytest:pytest pluggy:pluggy \
            iniconfig:iniconfig packaging:packaging pytest_timeout:pytest_timeout \
            hypothesis:hypothesis sortedcontainers:sortedcontainers attr:attrs; do
  module=${pair%%:*}; wheel=${pair#*:}
  if ! "$PY" -c "import $module" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" .whl/"$wheel"-*.whl
  fi
done
echo "$SITE" >"$("$PY" -c 'import site; print(site.getsitepackages()[0])')/xpulaunch-carry.pth"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
"$PY" -c 'import click, psutil, pynvml, pytest, hypothesis; print("gpu_env: python deps ok")'
