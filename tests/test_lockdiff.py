"""The lock comparison a refactor's proof reads (loopscope.tools.lockdiff)."""

import yaml

from loopscope.tools.lockdiff import compare, outputs


def lock(**outs: str) -> str:
    return yaml.safe_dump({"schema": "2.0", "stages": {
        f"s{i}": {"cmd": "x", "outs": [{"path": p, "md5": m}]}
        for i, (p, m) in enumerate(outs.items())}})


def test_each_output_is_sorted_by_its_fate():
    old = outputs(lock(**{"models/a": "1", "tables/b": "2", "gone": "3",
                          "metrics/stage_timings/a.json": "4"}))
    new = outputs(lock(**{"models/a": "1", "tables/b": "9", "added": "5",
                          "metrics/stage_timings/a.json": "6"}))
    found = compare(old, new)
    assert found["same"] == ["models/a"] and found["differ"] == ["tables/b"]
    assert found["new"] == ["added"] and found["gone"] == ["gone"]
    assert found["timings"] == ["metrics/stage_timings/a.json"]
