"""The Sluice service from Python: not built yet, so a pipeline file that sends stages to the
service is refused by name rather than run whole in this process."""
import pytest

import sluice

SPEC = """options { seed: 1 }
stage { id: "numbers" op: "range" params { key: "count" value: "10" } }
stage { id: "work" op: "identity" input: "numbers"
        distribute { service: "grpc://127.0.0.1:5050" processing_mode: DYNAMIC job_name: "train" } }
"""


def test_a_distributed_stage_is_refused_naming_it_and_what_to_do():
    with pytest.raises(sluice.SpecError, match=r"work.*distribute.*runs from `sluice run` for now.*remove distribute") as refused:
        sluice.Pipeline.from_spec(SPEC)
    assert refused.value.problems[0]["line"] == 3 and refused.value.problems[0]["stage"] == "work"
