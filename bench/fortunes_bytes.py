#!/usr/bin/env python3
"""fortunes_bytes.py DST [CORPUS]: the fortunes corpus's bytes as token ids in a raw uint16 file
(nanoGPT's train.bin format), so that a model with GPT-2's vocabulary of 50257 trains on real text
without a tokenizer. CORPUS: /usr/share/games/fortunes (Debian's fortunes packages). Used by the
GPT-2 124M benchmarks (bench/precision/gpt2_124m.sh, bench/checkpoint/*.sh)."""
import array
import os
import sys

dst = sys.argv[1]
corpus = sys.argv[2] if len(sys.argv) > 2 else "/usr/share/games/fortunes"
data = b""
for name in sorted(os.listdir(corpus)):
    path = os.path.join(corpus, name)
    if os.path.isfile(path) and "." not in name:  # the text files (not .dat indexes, .u8 links)
        with open(path, "rb") as f:
            data += f.read()
with open(dst, "wb") as f:
    array.array("H", data).tofile(f)  # little-endian uint16 on x86
print(f"data: {len(data)} tokens (bytes of {corpus})")
