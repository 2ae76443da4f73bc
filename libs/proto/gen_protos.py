"""Generate rlfleet_proto.v1 from protos/rlfleet/v1/*.proto.

protoc names modules after the proto package (`rlfleet.v1`); we publish them as
`rlfleet_proto.v1` so the top-level name `rlfleet` stays free. Import lines (and the
qualified names in .pyi stubs) are rewritten; the serialized descriptors keep the
proto package `rlfleet.v1`, which is what the wire uses.

Usage: python libs/proto/gen_protos.py [--out DIR]   (default: the package's v1 folder)
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "protos"
PACKAGE_DIR = Path(__file__).resolve().parent / "src" / "rlfleet_proto" / "v1"

# The committed stubs are reproducible only with these exact generator versions.
EXPECTED_VERSIONS = {"grpcio-tools": "1.85.1", "mypy-protobuf": "5.1.0"}

_PY_IMPORT = re.compile(r"^from rlfleet\.v1 import ", re.MULTILINE)
_PYI_NAME = re.compile(r"\brlfleet\.v1\.(\w+_pb2)\b")


def check_generator_versions() -> None:
    from importlib.metadata import version

    for dist, expected in EXPECTED_VERSIONS.items():
        found = version(dist)
        if found != expected:
            sys.exit(f"gen_protos: {dist} {found} installed, {expected} expected (run `uv sync`)")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc into out_dir; return the generated files."""
    from grpc_tools import protoc

    protos = sorted(PROTO_DIR.glob("rlfleet/v1/*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = Path(sys.executable).parent
        args = [
            "protoc",
            f"-I{PROTO_DIR}",
            f"-I{Path(protoc.__file__).parent / '_proto'}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *[str(p.relative_to(PROTO_DIR)) for p in protos],
        ]
        # mypy-protobuf announces every file on stderr; keep the run quiet unless it fails.
        if protoc.main(args) != 0:
            sys.exit("gen_protos: protoc failed (see above)")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(tmp) / "rlfleet" / "v1").iterdir()):
            text = src.read_text()
            text = _PY_IMPORT.sub("from rlfleet_proto.v1 import ", text)
            if src.suffix == ".pyi":
                text = _PYI_NAME.sub(r"rlfleet_proto.v1.\1", text)
            dst = out_dir / src.name
            dst.write_text(text)
            written.append(dst)
        init = out_dir / "__init__.py"
        init.write_text('"""Generated from protos/rlfleet/v1 by libs/proto/gen_protos.py."""\n')
        written.append(init)
        return written


WIRE_BASELINE = Path(__file__).resolve().parent / "wire_baseline.json"


def wire_snapshot() -> dict[str, dict[str, list[object]]]:
    """What old clients depend on: every field's number/type/label, every enum value's
    number, every method's types and streaming flags, keyed by full name."""
    import importlib

    from google.protobuf.descriptor import Descriptor, EnumDescriptor

    snap: dict[str, dict[str, list[object]]] = {}

    def add_enum(enum: EnumDescriptor) -> None:
        snap[enum.full_name] = {v.name: [v.number] for v in enum.values}

    def add_message(msg: Descriptor) -> None:
        snap[msg.full_name] = {
            f.name: [
                f.number,
                f.type,
                f.message_type.full_name
                if f.message_type
                else f.enum_type.full_name
                if f.enum_type
                else "",
                f.is_repeated,
            ]
            for f in msg.fields
        }
        for nested in msg.nested_types:
            if not nested.GetOptions().map_entry:
                add_message(nested)
        for enum in msg.enum_types:
            add_enum(enum)

    for proto in sorted(PROTO_DIR.glob("rlfleet/v1/*.proto")):
        module = importlib.import_module(f"rlfleet_proto.v1.{proto.stem}_pb2")
        fd = module.DESCRIPTOR
        for msg in fd.message_types_by_name.values():
            add_message(msg)
        for enum in fd.enum_types_by_name.values():
            add_enum(enum)
        for svc in fd.services_by_name.values():
            snap[svc.full_name] = {
                m.name: [
                    m.input_type.full_name,
                    m.output_type.full_name,
                    m.client_streaming,
                    m.server_streaming,
                ]
                for m in svc.methods
            }
    return snap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PACKAGE_DIR)
    parser.add_argument(
        "--update-wire-baseline",
        action="store_true",
        help="accept the current wire format as the compatibility baseline "
        "(only when releasing a breaking version)",
    )
    args = parser.parse_args()
    if args.update_wire_baseline:
        import json

        snap = wire_snapshot()
        blocks = [
            f"  {json.dumps(name)}: {{\n"
            + ",\n".join(
                f"    {json.dumps(member)}: {json.dumps(shape)}"
                for member, shape in sorted(snap[name].items())
            )
            + "\n  }"
            for name in sorted(snap)
        ]
        WIRE_BASELINE.write_text("{\n" + ",\n".join(blocks) + "\n}\n")
        print(WIRE_BASELINE.relative_to(ROOT))
        return
    check_generator_versions()
    if args.out == PACKAGE_DIR and PACKAGE_DIR.exists():
        shutil.rmtree(PACKAGE_DIR)
    for path in generate(args.out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


if __name__ == "__main__":
    main()
