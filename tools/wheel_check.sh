#!/usr/bin/env bash
# The built wheel, away from the source tree: `make dist-check` (and CI) run this after
# `make dist`.  In a new virtual environment in a temporary directory it installs the
# wheel with its torch, mpich and examples extras (torch==2.13.0 first: the CPU build,
# from pip's cache or the local wheel directory), then runs there
#   hvdrun --check-build,
#   a 2-rank allreduce on numpy arrays,
#   a 2-rank `import horovod` under hvdrun --as-horovod (the stand-in package ships),
#   examples/torch_digits.py, taken from the sdist, at 2 ranks for 2 epochs.
# Usage: tools/wheel_check.sh [DIST_DIR]   (default: dist/ of this checkout; PYTHON=python3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
dist=$(cd "${1:-$root/dist}" && pwd)
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/hvdlite/version.py")
wheel=$dist/hvdlite-$version-py3-none-any.whl
sdist=$dist/hvdlite-$version.tar.gz
for file in "$wheel" "$sdist"; do
    [ -f "$file" ] || { echo "wheel_check: no $file: run make dist first" >&2; exit 2; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/hvdlite-wheel-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
step() { echo "wheel_check: $*"; }

step "a new venv in $work, the wheel installed from $dist"
"$python" -m venv venv
venv/bin/python -m pip install -q torch==2.13.0
venv/bin/python -m pip install -q "$wheel[torch,mpich,examples]"
tar -xzf "$sdist" --strip-components=2 "hvdlite-$version/examples/torch_digits.py"
export PATH="$work/venv/bin:$PATH"
unset PYTHONPATH
python - "$root" <<'PY'
import os, sys
import hvdlite
where = os.path.realpath(hvdlite.__file__)
assert not where.startswith(os.path.realpath(sys.argv[1]) + os.sep), f"hvdlite from {where}"
print(f"wheel_check: hvdlite {hvdlite.__version__} from {os.path.dirname(where)}")
PY

step "hvdrun --check-build"
hvdrun --check-build

step "a 2-rank allreduce"
hvdrun -np 2 python -c '
import numpy as np, hvdlite as hvd
hvd.init()
total = hvd.allreduce(np.full(4, hvd.rank() + 1.0), op=hvd.Sum, name="x")
assert (total == 3.0).all(), total
print("allreduce ok on rank", hvd.rank())'

step "hvdrun --as-horovod: import horovod at 2 ranks"
hvdrun --as-horovod -np 2 python -c '
import horovod, horovod.common.util, hvdlite
assert horovod.__hvdlite_version__ == hvdlite.__version__
hvdlite.init()
print("import horovod gives hvdlite on rank", hvdlite.rank())'

step "examples/torch_digits.py from the sdist, 2 ranks"
hvdrun -np 2 python torch_digits.py --epochs 2 --checkpoint ''
step "passed"
