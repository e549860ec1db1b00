"""Reading a rendered report page in tests: `json_block(page, block_id)` is the JSON a
`<script type="application/json" id=...>` block of the page holds (the explorer's
`hs-explorer-data`, ...); `saved_and_rendered(analysis, folder)` saves an analysis, loads it back
with its explorer examples' tokens intact, and renders the loaded one."""
import json
import re

from headscope.analysis import Analysis
from headscope.report import render_html


def json_block(page: str, block_id: str):
    match = re.search(rf'<script type="application/json" id="{block_id}">(.*?)</script>', page, re.S)
    assert match is not None, f"the page has no JSON block {block_id!r}"
    return json.loads(match.group(1))


def saved_and_rendered(analysis, folder):
    """`(loaded analysis, its page, the page's explorer payload)` after `analysis.save(folder)`;
    asserts the examples' query and key tokens survive the round trip."""
    analysis.save(folder)
    again = Analysis.load(folder)
    assert [(e.tokens, e.key_tokens) for e in again.examples] == [(e.tokens, e.key_tokens) for e in analysis.examples]
    page = render_html(again, plotlyjs="cdn")
    return again, page, json_block(page, "hs-explorer-data")

