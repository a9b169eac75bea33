#!/usr/bin/env python3
"""Writes the hand-made seed corpus for the loader fuzz targets into
tests/corpus/{npy,checkpoint}/seed_*: a few valid files and hostile ones
(truncated header, 1 TB shape claim, negative dims, huge header length,
non-ASCII, ...). Re-run after changing a file format; crashers found by
scripts/fuzz.sh sit next to them as crash-*/timeout-*/oom-* files."""
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "corpus")


def npy(header, data=b"", version=1, header_len=None):
    dict_bytes = header.encode("latin-1") if isinstance(header, str) else header
    prefix = 10 if version == 1 else 12
    pad = (64 - (prefix + len(dict_bytes) + 1) % 64) % 64
    dict_bytes = dict_bytes + b" " * pad + b"\n"
    n = len(dict_bytes) if header_len is None else header_len
    size = struct.pack("<H", n) if version == 1 else struct.pack("<I", n)
    return b"\x93NUMPY" + bytes([version, 0]) + size + dict_bytes + data


def hdr(descr="<f4", shape="(2, 3)", fortran="False"):
    return "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)


def fnv1a64(b):
    h = 0xCBF29CE484222325
    for c in b:
        h ^= c
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def entry(name, dtype, dims, data, nbytes=None, ndim=None, name_len=None):
    name_b = name.encode("utf-8")
    out = struct.pack("<I", len(name_b) if name_len is None else name_len) + name_b
    out += struct.pack("<II", dtype, len(dims) if ndim is None else ndim)
    out += b"".join(struct.pack("<q", d) for d in dims)
    out += struct.pack("<Q", len(data) if nbytes is None else nbytes) + data
    return out


def ckpt(entries, count=None, version=1, seal=True):
    body = b"HGCKPT01" + struct.pack("<II", version, len(entries) if count is None else count) + b"".join(entries)
    return body + struct.pack("<Q", fnv1a64(body)) if seal else body


def f32(*vals):
    return b"".join(struct.pack("<f", v) for v in vals)


def f64(*vals):
    return b"".join(struct.pack("<d", v) for v in vals)


NPY = {
    "seed_valid_f32_2x3.npy": npy(hdr(), f32(1, 2, 3, 4, 5, 6)),
    "seed_valid_f64_scalar.npy": npy(hdr("<f8", "()"), f64(3.5)),
    "seed_valid_f32_empty.npy": npy(hdr("<f4", "(0, 5)")),
    "seed_valid_v2_f64_vec.npy": npy(hdr("<f8", "(3,)"), f64(1, -2, 0.5), version=2),
    "seed_truncated_header.npy": npy(hdr(), f32(1, 2, 3, 4, 5, 6))[:30],
    "seed_truncated_data.npy": npy(hdr(), f32(1, 2, 3, 4, 5, 6))[:-3],
    "seed_1tb_shape.npy": npy(hdr("<f4", "(262144, 1048576)"), f32(1, 2)),
    "seed_overflow_shape.npy": npy(hdr("<f8", "(4294967296, 4294967296, 16)"), f64(1)),
    "seed_huge_dims_then_zero.npy": npy(hdr("<f4", "(4611686018427387904, 4611686018427387904, 0)")),
    "seed_negative_dims.npy": npy(hdr("<f4", "(-2, -3)"), f32(1, 2, 3, 4, 5, 6)),
    "seed_huge_header_len_v1.npy": npy(hdr(), f32(1), header_len=0xFFFF),
    "seed_huge_header_len_v2.npy": npy(hdr(), f32(1), version=2, header_len=0xFFFFFFFF),
    "seed_non_ascii_header.npy": npy("{'descr': '<f4\u00e9\u00ff', 'fortran_order': False, 'shape': (1,), }", f32(1)),
    "seed_nul_in_header.npy": npy(b"{'descr': '<f4\x00', 'fortran_order': False, 'shape': (1,), }", f32(1)),
    "seed_many_dims.npy": npy(hdr("<f4", "(" + "1, " * 40 + ")"), f32(1)),
    "seed_fortran.npy": npy(hdr(fortran="True"), f32(1, 2, 3, 4, 5, 6)),
    "seed_big_endian.npy": npy(hdr(">f4"), f32(1, 2, 3, 4, 5, 6)),
    "seed_bad_version.npy": b"\x93NUMPY\x03\x00" + npy(hdr(), f32(1, 2, 3, 4, 5, 6))[8:],
    "seed_magic_only.npy": b"\x93NUMPY",
}

W = f32(0.5, -1, 2, 3)
CKPT = {
    "seed_valid_two_tensors.ckpt": ckpt([entry("w", 0, [2, 2], W), entry("b", 1, [1], f64(0.25))]),
    "seed_valid_empty_module.ckpt": ckpt([]),
    "seed_valid_scalar_and_zero_size.ckpt": ckpt([entry("s", 0, [], f32(1)), entry("z", 0, [0, 7], b"")]),
    "seed_valid_non_ascii_name.ckpt": ckpt([entry("caf\u00e9.\u00ff", 0, [1], f32(1))]),
    "seed_bad_checksum.ckpt": ckpt([entry("w", 0, [2, 2], W)])[:-1] + b"\x00",
    "seed_truncated.ckpt": ckpt([entry("w", 0, [2, 2], W)])[:25],
    "seed_unsealed_body.ckpt": ckpt([entry("w", 0, [2, 2], W)], seal=False),
    "seed_1tb_shape.ckpt": ckpt([entry("w", 0, [262144, 1048576], W, nbytes=1 << 40)]),
    "seed_1tb_nbytes_small_shape.ckpt": ckpt([entry("w", 0, [2, 2], W, nbytes=1 << 40)]),
    "seed_negative_dims.ckpt": ckpt([entry("w", 0, [-2, -2], W, nbytes=16)]),
    "seed_overflow_dims.ckpt": ckpt([entry("w", 1, [1 << 32, 1 << 32, 16], W, nbytes=0)]),
    "seed_nbytes_mismatch.ckpt": ckpt([entry("w", 0, [3], W)]),
    "seed_huge_name_len.ckpt": ckpt([entry("w", 0, [2, 2], W, name_len=0xFFFFFFFF)]),
    "seed_huge_count.ckpt": ckpt([entry("w", 0, [2, 2], W)], count=0xFFFFFFFF),
    "seed_huge_rank.ckpt": ckpt([entry("w", 0, [1] * 4, W, ndim=1000)]),
    "seed_bad_dtype.ckpt": ckpt([entry("w", 9, [2, 2], W)]),
    "seed_duplicate_name.ckpt": ckpt([entry("w", 0, [2, 2], W), entry("w", 0, [2, 2], W)]),
    "seed_trailing_bytes.ckpt": ckpt([entry("w", 0, [2, 2], W) + b"junk"]),
    "seed_bad_version.ckpt": ckpt([entry("w", 0, [2, 2], W)], version=7),
    "seed_bad_magic.ckpt": b"HGCKPT02" + ckpt([entry("w", 0, [2, 2], W)])[8:],
}

for folder, files in (("npy", NPY), ("checkpoint", CKPT)):
    os.makedirs(os.path.join(ROOT, folder), exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(ROOT, folder, name), "wb") as f:
            f.write(data)
print("wrote %d npy and %d checkpoint seeds" % (len(NPY), len(CKPT)))
