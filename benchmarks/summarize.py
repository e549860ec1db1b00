"""Print benchmarks/results.jsonl (from bench_heads.py) as a Markdown table of medians and ratios."""
import json
import sys
from pathlib import Path

NAMES = ["a_sdpa", "a_eager", "b_eager_maps", "c_transformer_lens", "d_headscope"]


def main(path: str = str(Path(__file__).parent / "results.jsonl")) -> None:
    print("| seq | batch | " + " | ".join(f"{n} s (GiB)" for n in NAMES) + " | d/a | d/a' | d/b | d/c | peak d/a | peak d/b |")
    print("|" + "---|" * (2 + len(NAMES) + 6))
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    for row in sorted(rows, key=lambda r: (r["seq_len"], r["batch"])):
        cells = []
        for name in NAMES:
            c = row["contenders"].get(name)
            if c is None:
                cells.append("-")
            elif "skipped" in c:
                cells.append(f"skipped: {c['skipped']}")
            else:
                cells.append(f"{c['seconds']:.2f} ({c['peak_gib']:.2f})")
        ratios = [row.get(k, "-") for k in ("time d/a", "time d/a_prime", "time d/b", "time d/c", "peak d/a", "peak d/b")]
        print(f"| {row['seq_len']} | {row['batch']} | " + " | ".join(cells) + " | " + " | ".join(map(str, ratios)) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
