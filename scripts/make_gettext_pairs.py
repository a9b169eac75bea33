#!/usr/bin/env python3
"""English -> German sentence pairs from the system's gettext catalogs.

Reads every /usr/share/locale/de/LC_MESSAGES/*.mo (compiled message catalogs
that Debian/Ubuntu packages install), keeps each msgid -> msgstr pair that is
translated, one line of prose-like text and of a sane length, deduplicates by
source and writes `source<TAB>target` lines (UTF-8) in a fixed order.
Standard library only (the .mo format is parsed with struct).

The catalogs are the packages' translations, licensed like the packages
(mostly GPL/LGPL): a TSV made from them is for local experiments.

  scripts/make_gettext_pairs.py --out data/gettext_en_de.tsv
"""
import argparse
import glob
import os
import re
import struct
import sys


def read_mo(path):
    """Yields (msgid, msgstr) of a .mo file; plural forms give their first form."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 28:
        return
    magic = struct.unpack("<I", data[:4])[0]
    order = "<" if magic == 0x950412DE else ">" if magic == 0xDE120495 else None
    if order is None:
        return
    _, count, ids_at, strs_at = struct.unpack(order + "4I", data[4:20])
    for i in range(count):
        id_len, id_off = struct.unpack(order + "2I", data[ids_at + 8 * i: ids_at + 8 * i + 8])
        s_len, s_off = struct.unpack(order + "2I", data[strs_at + 8 * i: strs_at + 8 * i + 8])
        msgid = data[id_off: id_off + id_len]
        msgstr = data[s_off: s_off + s_len]
        if b"\x04" in msgid:  # msgctxt EOT msgid
            msgid = msgid.split(b"\x04", 1)[1]
        msgid = msgid.split(b"\x00")[0]  # singular of a plural entry
        msgstr = msgstr.split(b"\x00")[0]
        try:
            yield msgid.decode("utf-8"), msgstr.decode("utf-8")
        except UnicodeDecodeError:
            continue


MARKUP = re.compile(r"<[^>]+>|%[-+ #0-9.]*[a-zA-Z]|\$\{|\{[0-9a-z_]*\}|&[a-z]+;")


def clean(text):
    """One line, single spaces, accelerator marks (_File, &File) removed."""
    text = " ".join(text.split())
    text = re.sub(r"(?<![\w&])[_&](?=\w)", "", text)
    return text


def keep(src, tgt, min_words, max_words):
    if not src or not tgt or src == tgt:
        return False
    ns, nt = len(src.split()), len(tgt.split())
    if not (min_words <= ns <= max_words and min_words <= nt <= max_words):
        return False
    if max(ns, nt) > 3 * min(ns, nt) + 2:  # misaligned or notes, not translations
        return False
    if len(MARKUP.findall(src)) > 2 or not re.search(r"[A-Za-z]{2}", src):
        return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locale-dir", default="/usr/share/locale/de/LC_MESSAGES")
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-words", type=int, default=2)
    ap.add_argument("--max-words", type=int, default=40)
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.locale_dir, "*.mo")))
    if not files:
        sys.exit(f"make_gettext_pairs: no .mo catalogs in {a.locale_dir}")
    seen, pairs, raw = set(), [], 0
    for path in files:
        for src, tgt in read_mo(path):
            if not src:
                continue  # the catalog header
            raw += 1
            src, tgt = clean(src), clean(tgt)
            if src in seen or not keep(src, tgt, a.min_words, a.max_words):
                continue
            seen.add(src)
            pairs.append((src, tgt))
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for src, tgt in pairs:
            f.write(f"{src}\t{tgt}\n")
    os.replace(tmp, a.out)
    print(f"make_gettext_pairs: {len(files)} catalogs, {raw} messages, {len(pairs)} pairs -> {a.out}")


if __name__ == "__main__":
    main()
