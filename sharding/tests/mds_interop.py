"""Helper for tests/mds_interop.rs: drives the real mosaicml-streaming package.

    python mds_interop.py write ROOT   # write every case with MDSWriter under ROOT/py, describe them in ROOT/cases.json
    python mds_interop.py read ROOT    # check what shardstream wrote under ROOT/rs with Mosaic's own code

Samples are rendered in shardstream's canonical JSON (value.rs, Value::to_canonical_json), so the
Rust side can compare them with what it decodes and rebuild the same values to write.
"""

import io
import json
import math
import os
import pickle
import random
import sys
from decimal import Decimal

import numpy as np
from PIL import Image
from streaming import MDSWriter, StreamingDataset
from streaming.base.compression import decompress
from streaming.base.format.mds.encodings import mds_encode
from streaming.base.hashing import get_hash
from streaming.base.util import merge_index

ALL_COLUMNS = {
    'b': 'bytes',
    's': 'str',
    'i': 'int',
    'u8': 'uint8',
    'u16': 'uint16',
    'u32': 'uint32',
    'u64': 'uint64',
    'i8': 'int8',
    'i16': 'int16',
    'i32': 'int32',
    'i64': 'int64',
    'f16': 'float16',
    'f32': 'float32',
    'f64': 'float64',
    'si': 'str_int',
    'sf': 'str_float',
    'sd': 'str_decimal',
    'pil': 'pil',
    'jpg': 'jpeg',
    'png': 'png',
    'ja': 'jpeg_array',
    'ja2': 'jpegarray',
    'lpil': 'list[pil]',
    'ljpg': 'list[jpeg]',
    'lpng': 'list[png]',
    'js': 'json',
    'pk': 'pkl',
    'nd': 'ndarray',
    'nd16': 'ndarray:int16',
    'ndf': 'ndarray:float32:2,3',
    'ndu8': 'ndarray:uint8',
    'ünï': 'str',
}

SCALAR_EDGES = {
    'uint8': [0, 1, 255],
    'uint16': [0, 513, 65535],
    'uint32': [0, 7, 2**32 - 1],
    'uint64': [0, 2**63, 2**64 - 1],
    'int8': [-128, 0, 127],
    'int16': [-32768, -1, 32767],
    'int32': [-2**31, 5, 2**31 - 1],
    'int64': [-2**63, -7, 2**63 - 1],
    'float16': [0.1, -0.0, float('inf'), float('nan'), 65504.0, 6e-08],
    'float32': [0.1, -2.5, float('-inf'), float('nan'), 3.4028235e38, 1e-45],
    'float64': [0.1, 1e-05, 1e16, float('nan'), -0.0, 5e-324, 1.7976931348623157e308],
}

ND_DTYPES = ['uint8', 'int8', 'uint16', 'int16', 'float16', 'uint32', 'int32', 'float32', 'uint64',
             'int64', 'float64']


def image(rng, mode, size):
    n = len(Image.new(mode, size).tobytes())
    return Image.frombytes(mode, size, bytes(rng.randrange(256) for _ in range(n)))


def jpeg_bytes(img):
    out = io.BytesIO()
    img.save(out, format='JPEG')
    return out.getvalue()


def array(rng, dtype, shape):
    n = int(np.prod(shape))
    if dtype.startswith('float'):
        values = [rng.choice([0.1, -1.5, 2.0, float('nan'), float('inf'), -0.0, rng.random()]) for _ in range(n)]
    else:
        info = np.iinfo(dtype)
        values = [rng.choice([int(info.min), int(info.max), 0, rng.randrange(int(info.min), int(info.max))]) for _ in range(n)]
    return np.array(values, dtype=dtype).reshape(shape)


def make_all(n, seed):
    rng = random.Random(seed)
    strs = ['', 'é', '😀 emoji', 'tab\t"quote"\\ nl\n', 'plain ascii', '\x00\x7f', 'ünï ﬁ']
    floats = [0.1, 1e-05, 1e16, float('inf'), float('-inf'), float('nan'), -0.0, 1.5, 123456.789, 1e22, 5e-324]
    decimals = ['1.50', '1E+2', '-0', 'NaN', 'Infinity', '0.0000001', '3.14159', '-12345678901234567890.5']
    samples = []
    for k in range(n):
        s = {}
        s['b'] = bytes(rng.randrange(256) for _ in range(0 if k == 0 else rng.randrange(60)))
        s['s'] = strs[k % len(strs)] + str(rng.random())[:k % 5]
        s['i'] = [0, -1, 2**63 - 1, -2**63, k * 1000, True][k % 6]
        for name, enc in ALL_COLUMNS.items():
            if enc in SCALAR_EDGES:
                edges = SCALAR_EDGES[enc]
                s[name] = getattr(np, enc)(edges[k % len(edges)])
        s['si'] = [0, -5, 10**30, -(10**40), k][k % 5]
        s['sf'] = floats[k % len(floats)]
        s['sd'] = Decimal(decimals[k % len(decimals)])
        modes = ['L', 'RGB', 'RGBA', '1', 'I;16']
        s['pil'] = image(rng, modes[k % len(modes)], (1 + k % 7, 1 + k % 5))
        s['jpg'] = image(rng, 'RGB', (8 + k % 3, 8))
        s['png'] = image(rng, ['RGB', 'L', 'RGBA'][k % 3], (5, 3 + k % 4))
        s['ja'] = [jpeg_bytes(image(rng, 'RGB', (4, 4))) for _ in range(1 + k % 3)]
        s['ja2'] = [jpeg_bytes(image(rng, 'L', (3, 5)))]
        s['lpil'] = [image(rng, 'RGB', (2, 2)) for _ in range(k % 3)]
        s['ljpg'] = [image(rng, 'RGB', (4, 3)) for _ in range(1 + k % 2)]
        s['lpng'] = [image(rng, 'LA', (3, 3)) for _ in range(k % 2)]
        s['js'] = [
            {'z': 1, 'a': [1.0, 1e16, 0.1, -0.0, None, True], 'ü': 'é😀'},
            [k, 'x', {'nested': {'deep': [1e300, -2]}}],
            'just a string',
            12345678901234567890,
            2.5,
            None,
            {},
        ][k % 7]
        s['pk'] = [[k, 'x'], {'a': k, 'b': (1, 2)}, 'pickled str', None][k % 4]
        dtype = ND_DTYPES[k % len(ND_DTYPES)]
        shapes = [(3,), (2, 3, 1), (1, 300), (4, 1, 1, 2)]
        s['nd'] = array(rng, dtype, shapes[k % len(shapes)])
        s['nd16'] = array(rng, 'int16', [(5,), (2, 2), (1, 1, 1)][k % 3])
        s['ndf'] = array(rng, 'float32', (2, 3))
        s['ndu8'] = array(rng, 'uint8', (1, 65536) if k == 3 else (2, 1 + k % 4))
        s['ünï'] = strs[(k + 3) % len(strs)]
        samples.append(s)
    return samples


def make_simple(n, seed, big=0):
    rng = random.Random(seed)
    samples = []
    for k in range(n):
        size = big if big else rng.randrange(10, 400)
        samples.append({
            'id': k,
            'txt': ' '.join(rng.choice(['lorem', 'ipsum', 'dolor', 'sit', 'ämet']) for _ in range(size // 6)),
            'arr': array(rng, 'uint16', (1 + k % 4,)),
            'f': np.float32(k / 4),
        })
    return samples


SIMPLE_COLUMNS = {'id': 'int', 'txt': 'str', 'arr': 'ndarray:uint16', 'f': 'float32'}


def fnum(x):
    x = float(x)
    if math.isnan(x):
        return 'nan'
    if math.isinf(x):
        return 'inf' if x > 0 else '-inf'
    return x


def tagged(ty, **fields):
    out = {'$type': ty}
    out.update(fields)
    return out


def image_file_bytes(img, fmt):
    # Decoded images keep their source buffer; input images are encoded as Mosaic would.
    fp = getattr(img, 'fp', None)
    if fp is not None and hasattr(fp, 'getvalue'):
        return fp.getvalue()
    return mds_encode(fmt, img)


def canon(enc, v):
    """Canonical JSON of a value as Mosaic would decode it from column encoding `enc`."""
    if isinstance(v, bytes) and enc not in ('bytes', 'pkl'):
        raise AssertionError(f'unexpected raw bytes for {enc}')
    if enc == 'bytes':
        return tagged('bytes', hex=v.hex())
    if enc == 'str':
        return v
    if enc == 'int':
        return int(v)
    if enc in SCALAR_EDGES:
        value = fnum(v) if enc.startswith('float') else int(v)
        return tagged(enc, value=value)
    if enc == 'str_int':
        return tagged('str_int', text=str(int(v)))
    if enc == 'str_float':
        return tagged('str_float', value=fnum(v))
    if enc == 'str_decimal':
        return tagged('str_decimal', text=str(v))
    if enc == 'pil':
        return tagged('pil', width=v.size[0], height=v.size[1], mode=v.mode, hex=v.tobytes().hex())
    if enc in ('jpeg', 'png'):
        return tagged(enc, hex=image_file_bytes(v, enc).hex())
    if enc in ('jpeg_array', 'jpegarray'):
        items = [x if isinstance(x, bytes) else image_file_bytes(x, 'jpeg') for x in v]
        return tagged('list', items=[tagged('jpeg', hex=x.hex()) for x in items])
    if enc.startswith('list['):
        inner = enc[5:-1]
        return tagged('list', items=[canon(inner, x) for x in v])
    if enc == 'json':
        return tagged('json', value=v)
    if enc == 'pkl':
        return tagged('pkl', hex=pickle.dumps(v).hex())
    if enc.startswith('ndarray'):
        flat = [fnum(x) if v.dtype.kind == 'f' else int(x) for x in v.reshape(-1).tolist()]
        return tagged('ndarray', dtype=v.dtype.name, shape=list(v.shape), values=flat)
    raise AssertionError(f'no canonical form for {enc}')


def canon_sample(columns, sample):
    return {name: canon(enc, sample[name]) for name, enc in columns.items()}


def cases():
    """(name, columns, samples, writer kwargs, split)"""
    out = []
    all_samples = make_all(24, 1)
    out.append(('all_raw', ALL_COLUMNS, all_samples, {}, None))
    out.append(('all_zstd_multi', ALL_COLUMNS, all_samples,
                {'compression': 'zstd', 'hashes': ['sha1', 'xxh64'], 'size_limit': 1 << 14}, None))
    simple = make_simple(300, 2)
    every_hash = sorted(['md5', 'sha1', 'sha224', 'sha256', 'sha384', 'sha512', 'sha3_224', 'sha3_256',
                         'sha3_384', 'sha3_512', 'blake2b', 'blake2s', 'xxh32', 'xxh64', 'xxh3_64',
                         'xxh128', 'xxh3_128'])
    out.append(('simple_zstd7_allhashes', SIMPLE_COLUMNS, simple,
                {'compression': 'zstd:7', 'hashes': every_hash, 'size_limit': 20000}, None))
    for comp in ['gz', 'gz:1', 'bz2', 'br', 'br:4', 'snappy']:
        out.append((f'simple_{comp.replace(":", "_")}', SIMPLE_COLUMNS, simple,
                    {'compression': comp, 'hashes': ['md5', 'xxh3_64'], 'size_limit': 8192}, None))
    out.append(('all_gz_multi', ALL_COLUMNS, all_samples,
                {'compression': 'gz', 'hashes': ['sha256'], 'size_limit': 1 << 14}, None))
    # A first sample larger than the limit: Mosaic writes an empty shard first.
    quirk = make_simple(3, 3, big=1000)
    out.append(('empty_shard_quirk', SIMPLE_COLUMNS, quirk, {'size_limit': 300, 'hashes': ['sha1']}, None))
    out.append(('no_limit', SIMPLE_COLUMNS, simple[:50], {'size_limit': None}, None))
    out.append(('no_samples', SIMPLE_COLUMNS, [], {'compression': 'zstd'}, None))
    out.append(('split_train', SIMPLE_COLUMNS, simple[:40], {'compression': 'zstd', 'size_limit': 4000}, 'train'))
    # Large shards: zstd frames of several MiB span several of zstd's multi-threaded jobs.
    out.append(('big_zstd', SIMPLE_COLUMNS, make_simple(2500, 4, big=4000), {'compression': 'zstd'}, None))
    return out


def write(root):
    described = []
    for name, columns, samples, kwargs, split in cases():
        out = os.path.join(root, 'py', name)
        if split:
            out = os.path.join(out, split)
        with MDSWriter(out=out, columns=columns, **kwargs) as w:
            for s in samples:
                w.write(s)
        described.append({
            'name': name,
            'columns': columns,
            'compression': kwargs.get('compression'),
            'hashes': kwargs.get('hashes', []),
            'size_limit': kwargs.get('size_limit', 1 << 26),
            'split': split,
            'samples': [canon_sample(columns, s) for s in samples],
        })
    # Parts merged by merge_index, as `--part I/N` plus `merge-index` will do.
    simple = make_simple(60, 5)
    for part in range(3):
        with MDSWriter(out=os.path.join(root, 'py', 'merge', str(part)), columns=SIMPLE_COLUMNS,
                       compression='zstd', hashes=['xxh64'], size_limit=3000) as w:
            for s in simple[part * 20:(part + 1) * 20]:
                w.write(s)
    merge_index(os.path.join(root, 'py', 'merge'), keep_local=True)
    described.append({
        'name': 'merge',
        'columns': SIMPLE_COLUMNS,
        'compression': 'zstd',
        'hashes': ['xxh64'],
        'size_limit': 3000,
        'split': None,
        'samples': [canon_sample(SIMPLE_COLUMNS, s) for s in simple],
    })
    with open(os.path.join(root, 'cases.json'), 'w') as f:
        json.dump(described, f)


def check_files(folder):
    """Mosaic's own hash and size check of every file an index lists."""
    with open(os.path.join(folder, 'index.json')) as f:
        index = json.load(f)
    assert index['version'] == 2
    for shard in index['shards']:
        files = [shard['raw_data']] + ([shard['zip_data']] if shard['zip_data'] else [])
        for info in files:
            path = os.path.join(folder, info['basename'])
            if not os.path.exists(path):
                continue
            data = open(path, 'rb').read()
            if info is shard['zip_data']:
                raw = decompress(shard['compression'], data)
                assert len(raw) == shard['raw_data']['bytes'], path
                for algo, want in shard['raw_data']['hashes'].items():
                    assert get_hash(algo, raw) == want, (path, algo)
            assert len(data) == info['bytes'], path
            for algo, want in info['hashes'].items():
                assert get_hash(algo, data) == want, (path, algo)


def read(root):
    with open(os.path.join(root, 'cases.json')) as f:
        described = json.load(f)
    failures = []
    for case in described:
        folder = os.path.join(root, 'rs', case['name'])
        if case['split']:
            folder = os.path.join(folder, case['split'])
        check_files(folder)
        if not case['samples']:
            continue
        ds = StreamingDataset(local=os.path.join(root, 'rs', case['name']), remote=None,
                              split=case['split'], batch_size=1, shuffle=False,
                              allow_unsafe_types=True)
        got = [canon_sample(case['columns'], ds[i]) for i in range(len(ds))]
        want = case['samples']
        # Round trip through JSON so NaN-free canonical forms compare like the Rust side.
        if json.loads(json.dumps(got)) != json.loads(json.dumps(want)):
            for i, (g, w) in enumerate(zip(got, want)):
                if g != w:
                    failures.append(f"{case['name']} sample {i}: {json.dumps(g)[:400]} != {json.dumps(w)[:400]}")
                    break
            else:
                failures.append(f"{case['name']}: {len(got)} samples, expected {len(want)}")
        del ds
    if failures:
        print('\n'.join(failures))
        sys.exit(1)
    print(f'mosaic read {len(described)} datasets written by shardstream')


if __name__ == '__main__':
    cmd, root = sys.argv[1], sys.argv[2]
    {'write': write, 'read': read}[cmd](root)
