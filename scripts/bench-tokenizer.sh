#!/usr/bin/env bash
# Tokenizer speed: encodes and decodes a few MB of mixed text (prose, code, numbers, whitespace runs, CJK,
# Arabic, Hindi, emoji: the fixture strings of tests/fixtures/tokenizers, repeated) with each tokenizer folder
# given (default: every fixture family, plus models/tiny when present) and prints MB/s, median of 5 runs.
# Uses `llm-run tokenize --bench`; LLM_RUN overrides the binary. Not a test: nothing here asserts a speed.
set -euo pipefail
cd "$(dirname "$0")/.."
LLM_RUN=${LLM_RUN:-build/llm-run}
MB=${MB:-4}
text=$(mktemp /tmp/llm-bench-text.XXXXXX)
trap 'rm -f "$text"' EXIT
python3 - "$text" "$MB" <<'PY'
import json, sys
out, mb = sys.argv[1], float(sys.argv[2])
cases = json.load(open("tests/fixtures/tokenizers/llama3/cases.json", encoding="utf-8"))["cases"]
chunk = "\n".join(c["text"] for c in cases if "\x00" not in c["text"]) + "\n"
data = chunk * max(1, int(mb * 1e6 / len(chunk.encode("utf-8"))))
open(out, "w", encoding="utf-8").write(data)
PY
dirs=("$@")
if [ ${#dirs[@]} -eq 0 ]; then
    dirs=(tests/fixtures/tokenizers/*/)
    [ -f models/tiny/tokenizer.json ] && dirs+=(models/tiny)
fi
echo "text: $(wc -c <"$text") bytes of mixed text; $(nproc) cores, one used"
for d in "${dirs[@]}"; do
    echo "== ${d%/}"
    "$LLM_RUN" tokenize --bench --no-bos "${d%/}" -f "$text"
done
