"""SWE task instances in the SWE-bench row format, so SWE-bench, SWE-Gym and R2E-Gym rows
and rlfleet's bundled tiny instances load the same way.

SWE-bench publishes FAIL_TO_PASS / PASS_TO_PASS as JSON strings holding lists of test ids;
both that and plain lists are accepted. `image`, `workdir` and `test_command` are what the
runner needs on top of SWE-bench's fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_TEST_COMMAND = "python3 -m pytest -rA -p no:cacheprovider"


class SweInstance(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    instance_id: str = Field(min_length=1)
    repo: str = ""
    base_commit: str = ""
    patch: str = ""
    """The gold fix (a unified diff)."""
    test_patch: str = ""
    fail_to_pass: list[str] = Field(alias="FAIL_TO_PASS")
    pass_to_pass: list[str] = Field(default_factory=list, alias="PASS_TO_PASS")
    problem_statement: str = ""
    image: str = ""
    workdir: str = "/testbed"
    test_command: str = DEFAULT_TEST_COMMAND

    @field_validator("fail_to_pass", "pass_to_pass", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else []
        return value


def load_instances(path: Path) -> list[SweInstance]:
    """Rows of a JSONL file; an error names the line."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(SweInstance.model_validate_json(line))
        except ValueError as error:
            raise ValueError(f"{path}:{number}: {error}") from error
    return rows
