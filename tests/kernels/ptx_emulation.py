"""A PTX emulator for the kernels' inline assembly (which only a GPU runs): straight-line blocks of the
integer, float16x2, conversion, shared- and global-memory instructions they use, run for one lane on 32-bit
register values (64-bit for addresses; float inputs as Python floats)."""

import numpy as np


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode, selectors 0–7): byte j of the result is byte selector[j] of {b, a}."""
    source, out = (b << 32) | a, 0
    for j in range(4):
        pick = (selector >> (4 * j)) & 0xF
        assert pick < 8, "a selector with bit 3 set would replicate a sign"
        out |= ((source >> (8 * pick)) & 0xFF) << (8 * j)
    return out


def _lop3_eval(a: int, b: int, c: int, table: int) -> int:
    out = 0
    for bit in range(32):
        sel = ((0xF0 if (a >> bit) & 1 else 0x0F) & (0xCC if (b >> bit) & 1 else 0x33)
               & (0xAA if (c >> bit) & 1 else 0x55))  # fmt: skip
        out |= (1 if table & sel else 0) << bit
    return out


def _f16x2(op, a: int, b: int) -> int:
    x = np.array([a & 0xFFFF, a >> 16], dtype=np.uint16).view(np.float16)
    y = np.array([b & 0xFFFF, b >> 16], dtype=np.uint16).view(np.float16)
    r = np.array(op(x, y), dtype=np.float16).view(np.uint16)
    return int(r[0]) | (int(r[1]) << 16)


def _cvt_rzi_u32(x: float) -> int:
    """cvt.rzi.u32.f32: truncate, saturating to [0, 2^32 − 1]; NaN → 0."""
    if x != x:
        return 0
    return int(min(max(np.trunc(np.float32(x)), 0.0), 2.0**32 - 1))


def _address(operand: str, val) -> int:
    """A shared-memory address operand `base` or `base+offset` (brackets stripped)."""
    base, _, offset = operand.partition("+")
    return val(base) + (int(offset, 0) if offset else 0)


def run_ptx(
    asm: str, regs: dict, lane: int = 0, shared: np.ndarray | None = None, warp: int = 0,
    global_words: dict[int, int] | None = None,
) -> dict:  # fmt: skip
    """One lane's run of a straight-line PTX block, nested scopes flattened (immediates in hex or decimal;
    `shared`: the shared memory as 32-bit words at global_smem; %tid.x = 32·warp + lane; `global_words`:
    global memory as {byte address: 32-bit word}); 16-bit outputs `{$i, $j}` land as 16-bit values."""
    regs = dict(regs)

    def val(token: str) -> int:
        token = token.strip()
        return regs[token] if token in regs else int(token, 0)

    for ins in asm.strip("{} ").split(";"):
        ins = ins.strip().lstrip("{} ")  # nested scopes ({ … }) open or close before an instruction
        if not ins or ins.startswith(".reg"):
            continue
        op, rest = ins.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):  # split a register into two 16-bit halves
            halves, src = rest[1:].split("}")
            lo, hi = (h.strip() for h in halves.split(","))
            word = val(src.strip(", "))
            regs[lo], regs[hi] = word & 0xFFFF, word >> 16
            continue
        if op in ("ld.shared.v2.b32", "ld.shared.v4.b32"):  # ld.shared.vN.b32 {a, …}, [base(+offset)]
            dests, source = rest.split("}")
            address = _address(source.strip(", []"), val)
            assert address % (4 * len(dests.split(","))) == 0
            for k, dest in enumerate(d.strip() for d in dests.strip(" {").split(",")):
                regs[dest] = int(shared[address // 4 + k])
            continue
        if op == "st.shared.v4.b32":  # st.shared.v4.b32 [base+offset], {a, b, c, d}
            target, values = rest.split("],")
            base, offset = target.strip("[ ").split("+")
            address = val(base) + int(offset, 0)
            assert address % 16 == 0
            words = [val(v) for v in values.strip(" {}").split(",")]
            shared[address // 4 : address // 4 + 4] = words
            continue
        dest, *srcs = (t.strip() for t in rest.split(","))
        if op == "mov.u32" and srcs == ["%laneid"]:
            regs[dest] = lane
        elif op == "mov.u32" and srcs == ["%tid.x"]:
            regs[dest] = 32 * warp + lane
        elif op == "mov.u32" and srcs == ["global_smem"]:
            regs[dest] = 0
        elif op == "ld.global.nc.b32":
            regs[dest] = global_words[val(srcs[0].strip("[]"))]
        elif op == "mad.wide.u32":
            a, b, c = (val(t) for t in srcs)
            regs[dest] = (a * b + c) & 0xFFFFFFFFFFFFFFFF
        elif op == "cvt.rzi.u32.f32":
            regs[dest] = _cvt_rzi_u32(val(srcs[0]))
        elif op == "ld.shared.b32":
            address = _address(srcs[0].strip("[]"), val)
            assert address % 4 == 0
            regs[dest] = int(shared[address // 4])
        else:
            args = [val(s) for s in srcs]
            regs[dest] = {
                "mov.b32": lambda a: a,
                "and.b32": lambda a, b: a & b,
                "or.b32": lambda a, b: a | b,
                "shl.b32": lambda a, b: a << b,
                "shr.u32": lambda a, b: a >> b,
                "shf.r.clamp.b32": lambda a, b, c: (((b << 32) | a) >> min(c, 32)) & 0xFFFFFFFF,
                "add.u32": lambda a, b: a + b,
                "mul.lo.u32": lambda a, b: a * b,
                "min.u32": min,
                "mad.lo.u32": lambda a, b, c: a * b + c,
                "prmt.b32": lambda a, b, c: _prmt(a, b, c & 0xFFFF),
                "lop3.b32": _lop3_eval,
                "sub.f16x2": lambda a, b: _f16x2(np.subtract, a, b),
            }[op](*args) & 0xFFFFFFFF
    return regs
