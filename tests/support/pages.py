"""Reading a rendered report page in tests: `json_block(page, block_id)` is the JSON a
`<script type="application/json" id=...>` block of the page holds (the explorer's
`hs-explorer-data`, ...)."""
import json
import re


def json_block(page: str, block_id: str):
    match = re.search(rf'<script type="application/json" id="{block_id}">(.*?)</script>', page, re.S)
    assert match is not None, f"the page has no JSON block {block_id!r}"
    return json.loads(match.group(1))
