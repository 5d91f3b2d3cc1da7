"""The documentation tells the truth about the code: the generated spec reference is current,
every job spec field and every BRORL_* setting is documented, links resolve, and nothing
cites a file this repository does not have."""
import re
import subprocess
from pathlib import Path

import pytest

from cli.spec_doc import REGENERATE, spec_markdown
from trainer.spec import json_schema

REPO = Path(__file__).resolve().parents[1]


def test_committed_jobspec_reference_is_current():
    committed = (REPO / "docs" / "jobspec.md").read_text()
    assert committed == spec_markdown(), f"docs/jobspec.md is stale: regenerate with `make docs` or `{REGENERATE}`"


def test_every_job_spec_field_has_a_description():
    schema = json_schema()
    objects = {"JobSpec": schema, **schema["$defs"]}
    missing = [f"{name}.{field}" for name, obj in objects.items()
               for field, node in obj.get("properties", {}).items() if not node.get("description")]
    assert not missing, f"give these fields a description= in trainer/spec.py: {missing}"
