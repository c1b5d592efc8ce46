#!/usr/bin/env python3
"""Rewrites one kernels/cuda/*.cu file into C++ for the kernel emulator (kernels/cuda/emu).

Three rewrites, nothing else (line numbers are kept, so compiler errors and the emulator's
fault messages point at the .cu source through a #line directive):
  k<<<grid, block[, smem[, stream]]>>>(args)
      -> ::snap_emu::launch(::snap_emu::Config(grid, block[, smem[, stream]]),
                            ::snap_emu::Site{"k", "file.cu", line}, &k, args)
  extern __shared__ [__align__(N)] T name[];  -> T* name = static_cast<T*>(::snap_emu::dynamic_shared());
  __shared__ T a[N], b[M];         -> T (&a)[N] = *static_cast<T(*)[N]>(::snap_emu::shared_slot(...)); ...
and `#include "kernels/cuda/emu/kernel_lang.h"` in front.

Usage: emu_rewrite.py IN.cu OUT.cpp
"""
import os
import re
import sys


def fail(path, line, msg):
    sys.exit(f"{path}:{line}: emu_rewrite: {msg}")


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def matching(text, start, open_ch, close_ch):
    """Index just past the bracket that closes text[start] (== open_ch)."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


KERNEL_NAME = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;(){}]*>)?)\s*$")


def rewrite_launches(text, path):
    out = []
    pos = 0
    base = os.path.basename(path)
    while True:
        i = text.find("<<<", pos)
        if i < 0:
            out.append(text[pos:])
            return "".join(out)
        m = None  # the name that ends right at <<<
        for cand in KERNEL_NAME.finditer(text[max(0, i - 300):i]):
            m = cand
        if m is None:
            fail(path, line_of(text, i), "no kernel name before <<<")
        name_start = max(0, i - 300) + m.start(1)
        name = m.group(1)
        j = text.find(">>>", i)
        if j < 0:
            fail(path, line_of(text, i), "<<< without >>>")
        cfg = text[i + 3:j]
        k = j + 3
        while text[k].isspace():
            k += 1
        if text[k] != "(":
            fail(path, line_of(text, i), "no argument list after >>>")
        end = matching(text, k, "(", ")")
        if end < 0:
            fail(path, line_of(text, i), "unbalanced argument list")
        args = text[k + 1:end - 1]
        line = line_of(text, name_start)
        call = (f'::snap_emu::launch(::snap_emu::Config({cfg}), ::snap_emu::Site{{"{name}", "{base}", {line}}}, '
                f"&{name}{', ' if args.strip() else ''}{args})")
        out.append(text[pos:name_start])
        out.append(call)
        pos = end


SHARED_EXTERN = re.compile(
    r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?((?:unsigned\s+)?[\w:]+)\s+(\w+)\s*\[\s*\]\s*;")
SHARED_STATIC = re.compile(r"__shared__\s+([\w:]+)\s+([^;]+);")


def split_top(s):
    parts, depth, cur = [], 0, ""
    for c in s:
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts]


def rewrite_shared(text, path):
    text = SHARED_EXTERN.sub(lambda m: f"{m.group(1)}* {m.group(2)} = static_cast<{m.group(1)}*>(::snap_emu::dynamic_shared());",
                             text)

    def one(m):
        ty = m.group(1)
        decls = []
        for d in split_top(m.group(2)):
            dm = re.fullmatch(r"(\w+)\s*((?:\[[^\]]+\])*)", d)
            if not dm:
                fail(path, line_of(text, m.start()), f"cannot read __shared__ declarator '{d}'")
            name, dims = dm.group(1), dm.group(2)
            full = f"{ty}{dims}"
            if dims:
                decls.append(f"{ty} (&{name}){dims} = *static_cast<{ty}(*){dims}>(::snap_emu::shared_slot("
                             f'sizeof({full}), alignof({ty}), "{name}"));')
            else:
                decls.append(f"{ty}& {name} = *static_cast<{ty}*>(::snap_emu::shared_slot(sizeof({ty}), alignof({ty}), "
                             f'"{name}"));')
        return " ".join(decls)

    return SHARED_STATIC.sub(one, text)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: emu_rewrite.py IN.cu OUT.cpp")
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    text = rewrite_shared(text, src)
    text = rewrite_launches(text, src)
    header = f'#include "kernels/cuda/emu/kernel_lang.h"\n#line 1 "{os.path.abspath(src)}"\n'
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    tmp = dst + ".tmp"
    with open(tmp, "w") as f:
        f.write(header + text)
    os.replace(tmp, dst)


if __name__ == "__main__":
    main()
