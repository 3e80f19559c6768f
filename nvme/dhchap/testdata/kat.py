#!/usr/bin/env python3
"""Known-answer vectors for kat_test.go, computed with Python's hashlib,
hmac, zlib and built-in integers: an implementation independent of the
package's, following the computations of Linux (drivers/nvme/common/auth.c:
nvme_auth_extract_key, nvme_auth_transform_key, nvme_auth_augmented_challenge;
drivers/nvme/host/auth.c: nvme_auth_dhchap_setup_host_response and
_setup_ctrl_response; crypto/dh.c pads DH values to the prime's size).

Run: python3 testdata/kat.py < testdata/ffdhe2048.hex
"""
import base64, hashlib, hmac, struct, sys, zlib

H = {1: hashlib.sha256, 2: hashlib.sha384, 3: hashlib.sha512}
HOST = "nqn.2014-08.org.nvmexpress:uuid:6a7b3c1e-0d4f-4e8a-9b2c-5f1e0a9d8c7b"
SUB = "nqn.2024-01.io.nprdma:kat"

def secret(key, h):
    raw = key + struct.pack("<I", zlib.crc32(key) & 0xffffffff)
    return "DHHC-1:%02d:%s:" % (h, base64.b64encode(raw).decode())

def transform(key, h, nqn):
    if h == 0:
        return key
    return hmac.new(key, nqn.encode() + b"NVMe-over-Fabrics", H[h]).digest()

def response(key, h, c, seq, tid, label, n1, n2):
    m = c + struct.pack("<IHB", seq, tid, 0) + label + n1.encode() + b"\0" + n2.encode()
    return hmac.new(key, m, H[h]).digest()

def augmented(h, sess, c):
    return hmac.new(H[h](sess).digest(), c, H[h]).digest()

p = int(sys.stdin.read().strip(), 16)
size = (p.bit_length() + 7) // 8
out = {}
for h, klen in ((1, 32), (2, 48), (3, 64)):
    key = bytes(range(klen))
    hl = H[h]().digest_size
    c1 = bytes((0x40 + i) & 0xff for i in range(hl))
    c2 = bytes((0xa0 + i) & 0xff for i in range(hl))
    kh = transform(key, h, HOST)
    kc = transform(bytes(reversed(key)), h, SUB)
    out["secret%d" % h] = secret(key, h)
    out["ctrlsecret%d" % h] = secret(bytes(reversed(key)), h)
    out["kh%d" % h] = kh.hex()
    out["kc%d" % h] = kc.hex()
    out["r1_%d" % h] = response(kh, h, c1, 0x01020304, 7, b"HostHost", HOST, SUB).hex()
    out["r2_%d" % h] = response(kc, h, c2, 0x0a0b0c0d, 7, b"Controller", SUB, HOST).hex()
x1 = int("1" + "23456789abcdef" * 4, 16) & ((1 << 225) - 1)
x2 = int("f" + "edcba987654321" * 4, 16) & ((1 << 225) - 1)
y1, y2 = pow(2, x1, p), pow(2, x2, p)
s = pow(y2, x1, p)
assert s == pow(y1, x2, p)
out["x1"] = "%058x" % x1
out["x2"] = "%058x" % x2
out["y1"] = y1.to_bytes(size, "big").hex()
out["y2"] = y2.to_bytes(size, "big").hex()
sess = s.to_bytes(size, "big")
out["session"] = sess.hex()
c1 = bytes((0x40 + i) & 0xff for i in range(32))
out["aug1"] = augmented(1, sess, c1).hex()
kh = transform(bytes(range(32)), 1, HOST)
out["r1dh"] = response(kh, 1, augmented(1, sess, c1), 0x01020304, 7, b"HostHost", HOST, SUB).hex()
for k, v in out.items():
    print("%s=%s" % (k, v))
