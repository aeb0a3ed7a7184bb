"""Dropout masks: an independent pure-Python Philox4x32-10 (Salmon et al. 2011) with the
keying documented in extensions/include/loom_ops/philox.h reproduces the library's mask
bits; masks do not depend on how the global tensor is split; and CPU and CUDA masks are
bit-identical."""
import pytest
import torch

from test_ops_lib import DEVICES, L

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK32 = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & MASK32, p1 & MASK32, \
            ((p0 >> 32) ^ c3 ^ k1) & MASK32, p0 & MASK32
    return c0, c1, c2, c3


def test_python_philox_matches_random123_kat():
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) \
        == (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)


def keep_bit(seed, stream, g, p):
    q = g >> 2
    words = philox4x32_10((q & MASK32, q >> 32, stream & MASK32, stream >> 32),
                          (seed & MASK32, seed >> 32))
    threshold = int((1.0 - p) * 2.0 ** 32 + 0.5) if p > 0 else 1 << 32
    return words[g & 3] < threshold


@pytest.mark.parametrize("device", DEVICES)
def test_mask_bits_follow_the_documented_keying(device):
    gshape, off, local = [5, 3, 9], [1, 1, 2], [3, 2, 6]
    seed, stream, p = 0xDEADBEEF12345, (7 << 24) | (3 << 8) | 1, 0.35
    mask = L.dropout_mask(torch.empty(local, device=device), p, seed, stream, gshape, off).cpu()
    for i in range(3):
        for j in range(2):
            for k in range(6):
                g = ((i + 1) * 3 + (j + 1)) * 9 + (k + 2)
                assert bool(mask[i, j, k]) == keep_bit(seed, stream, g, p), (i, j, k)


@pytest.mark.parametrize("device", DEVICES)
def test_masks_are_layout_independent(device):
    s, b, h, t = 16, 4, 40, 4
    full = L.dropout_mask(torch.empty(s, b, h, device=device), 0.3, 1, 2, [], [])
    for r in range(t):
        for b0 in (0, 2):
            shard = L.dropout_mask(torch.empty(s // t, 2, h, device=device), 0.3, 1, 2,
                                   [s, b, h], [r * s // t, b0, 0])
            assert torch.equal(shard, full[r * s // t:(r + 1) * s // t, b0:b0 + 2])


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
def test_cpu_and_cuda_masks_are_bit_identical():
    for shape, gshape, off in [([64, 8, 1024], [128, 8, 1024], [64, 0, 0]),
                               ([2, 3, 37, 37], [2, 12, 37, 37], [0, 6, 0, 0]),
                               ([7, 13], [], [])]:
        for p in (0.1, 0.5):
            cpu = L.dropout_mask(torch.empty(shape), p, 99, 5, gshape, off)
            gpu = L.dropout_mask(torch.empty(shape, device="cuda"), p, 99, 5, gshape, off)
            assert torch.equal(cpu, gpu.cpu()), (shape, p)
            x = torch.randn(shape)
            assert torch.equal(L.dropout(x, p, 99, 5, gshape, off) != 0,
                               L.dropout(x.cuda(), p, 99, 5, gshape, off).cpu() != 0)
