"""Generate the Python code of every `.proto` in src/assay/proto/ (the one definition of the API).

    python scripts/gen_proto.py            # regenerate src/assay/proto/*_pb2*.py(i)
    python scripts/gen_proto.py --check    # exit 1 if the checked-in code is stale

Sources live in src/assay/proto/ and import each other as "assay/proto/NAME.proto", so the
generated modules import each other as `assay.proto.NAME_pb2`, the package they are
installed as. Typed stubs (.pyi) come from mypy-protobuf.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "src" / "assay" / "proto"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out: Path) -> list[Path]:
    """Generate into `out`; return the generated files."""
    import grpc_tools
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        include = Path(tmp) / "src"
        package = include / "assay" / "proto"
        package.mkdir(parents=True)
        sources = sorted(PROTO.glob("*.proto"))
        for source in sources:
            shutil.copy2(source, package / source.name)
        well_known = Path(grpc_tools.__file__).parent / "_proto"
        gen = Path(tmp) / "gen"
        gen.mkdir()
        plugin = Path(sys.executable).parent / "protoc-gen-mypy"
        grpc_plugin = Path(sys.executable).parent / "protoc-gen-mypy_grpc"
        args = [
            "protoc",
            f"-I{include}",
            f"-I{well_known}",
            f"--python_out={gen}",
            f"--grpc_python_out={gen}",
            f"--plugin=protoc-gen-mypy={plugin}",
            f"--mypy_out={gen}",
            f"--plugin=protoc-gen-mypy_grpc={grpc_plugin}",
            f"--mypy_grpc_out={gen}",
            *[f"assay/proto/{s.name}" for s in sources],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for file in sorted((gen / "assay" / "proto").iterdir()):
            if file.name.endswith(SUFFIXES):
                target = out / file.name
                shutil.copy2(file, target)
                written.append(target)
        return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    options = parser.parse_args()
    if not options.check:
        for old in PROTO.iterdir():
            if old.name.endswith(SUFFIXES):
                old.unlink()
        for file in generate(PROTO):
            print(f"wrote {file.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {f.name: f.read_bytes() for f in generate(Path(tmp))}
    current = {f.name: f.read_bytes() for f in PROTO.iterdir() if f.name.endswith(SUFFIXES)}
    stale = sorted(n for n in fresh.keys() | current.keys() if fresh.get(n) != current.get(n))
    if stale:
        print(
            "generated code is stale: " + ", ".join(stale) + "; run python scripts/gen_proto.py",
            file=sys.stderr,
        )
        return 1
    print("generated code is fresh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
