#!/usr/bin/env python3
"""Rewrites one of the model's CUDA sources (model/cuda/*.cu, *.cuh) into host C++ for the emulator.

Why: t_cuda_emu_tables checks the CUDA model's kernels and kernel tables on the CPU (emu_cuda.h says why and what the
emulation does not model). The build runs this script on the real sources, so an edited kernel is re-converted and
checked as it is; nothing here knows any kernel.

What it changes, and nothing else:
  - a launch  name<tpl><<<grid, block[, smem[, stream]]>>>(args)  becomes
        emu_run_grid(kernel_id, dim3(grid), dim3(block), smem, [&]() { name<tpl>(args); })
    kernel_id is the template instance's address (what cudaFuncSetAttribute was given), else nullptr;
  - `extern __shared__` becomes `extern` (the emulator's one dynamic shared-memory array);
  - `__shared__ T a[..], b[..];` becomes static locals registered with EMU_SHARED, which the emulator poisons before
    every block (blocks run one at a time, so one copy is right);
  - emu_cuda.h is included first.
It fails (exit 1, naming the file and the text) on a launch or a __shared__ declaration it cannot parse, rather than
emit code that would test something else.

Usage: convert_cu.py IN OUT
"""
import os
import re
import sys


class ConvertError(Exception):
    pass


def split_top(s):
    """Splits s at the commas that are not inside brackets."""
    parts, depth, cur = [], 0, ''
    for ch in s:
        if ch in '([{':
            depth += 1
        elif ch in ')]}':
            depth -= 1
        if ch == ',' and depth == 0:
            parts.append(cur.strip())
            cur = ''
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def kernel_name_start(src, j):
    """The start of the kernel expression (an identifier with optional <...>) that ends just before src[j]."""
    k = j
    while k > 0 and src[k - 1].isspace():
        k -= 1
    end = k
    if src[k - 1] == '>':  # template arguments
        depth = 0
        while True:
            k -= 1
            if k < 0:
                raise ConvertError('unbalanced template arguments before ' + src[j:j + 40])
            if src[k] == '>':
                depth += 1
            elif src[k] == '<':
                depth -= 1
                if depth == 0:
                    break
    while k > 0 and (src[k - 1].isalnum() or src[k - 1] == '_'):
        k -= 1
    if k == end or not (src[k].isalpha() or src[k] == '_'):
        raise ConvertError('no kernel name before ' + src[j:j + 40])
    return k, src[k:end]


def matching_paren(src, p):
    depth = 0
    for q in range(p, len(src)):
        if src[q] == '(':
            depth += 1
        elif src[q] == ')':
            depth -= 1
            if depth == 0:
                return q
    raise ConvertError('unbalanced arguments after ' + src[p - 20:p + 20])


def convert_launches(src):
    out, i, n = [], 0, 0
    while True:
        j = src.find('<<<', i)
        if j < 0:
            out.append(src[i:])
            return ''.join(out), n
        k, name = kernel_name_start(src, j)
        e = src.find('>>>', j)
        if e < 0:
            raise ConvertError('no >>> after ' + src[j:j + 40])
        cfg = split_top(src[j + 3:e])
        if not 2 <= len(cfg) <= 4:
            raise ConvertError('launch configuration of %d parts: %s' % (len(cfg), src[j:e + 3]))
        smem = cfg[2] if len(cfg) > 2 else '0'
        p = e + 3
        while src[p].isspace():
            p += 1
        if src[p] != '(':
            raise ConvertError('no argument list after ' + src[j:p + 20])
        q = matching_paren(src, p)
        args = src[p + 1:q].strip()
        kernel_id = '(const void *)%s' % name if '<' in name else 'nullptr'
        out.append(src[i:k])
        out.append('emu_run_grid(%s, dim3(%s), dim3(%s), %s, [&]() { %s(%s); })' %
                   (kernel_id, cfg[0], cfg[1], smem, name, args))
        i = q + 1
        n += 1


def convert_shared(src):
    src = src.replace('extern __shared__', 'extern')

    def static_decl(m):
        indent, typ, decls = m.group(1), m.group(2), m.group(3)
        names = []
        for d in split_top(decls):
            nm = re.match(r'\s*(\w+)', d)
            if not nm:
                raise ConvertError('cannot read the __shared__ declaration ' + m.group(0))
            names.append(nm.group(1))
        return '%sstatic %s %s; %s' % (indent, typ, decls, ' '.join('EMU_SHARED(%s);' % x for x in names))

    src = re.sub(r'^(\s*)__shared__\s+(\w+)\s+([^;]+);', static_decl, src, flags=re.M)
    code = re.sub(r'//[^\n]*', '', re.sub(r'/\*.*?\*/', '', src, flags=re.S))
    if '__shared__' in code:
        raise ConvertError('a __shared__ declaration this script cannot convert is left')
    return src


def main():
    if len(sys.argv) != 3:
        print('usage: convert_cu.py IN OUT', file=sys.stderr)
        return 2
    src_path, out_path = sys.argv[1], sys.argv[2]
    with open(src_path) as f:
        src = f.read()
    try:
        text, _ = convert_launches(src)
        text = convert_shared(text)
    except ConvertError as e:
        print('convert_cu.py: %s: %s' % (src_path, e), file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, 'w') as f:
        f.write('/* Generated by tests/cuda_emu/convert_cu.py from %s: do not edit. */\n' % src_path)
        f.write('#include "emu_cuda.h"\n')
        f.write('#line 1 "%s"\n' % src_path)
        f.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
