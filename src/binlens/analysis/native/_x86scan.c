/* binlens.analysis.native._x86scan: the plain part of an x86/x86-64 chunk, decoded in C.
 *
 * `scan` walks straight-line code from a byte offset for as long as every instruction is one this
 * file knows exactly: the common integer, SSE and branch encodings of compiled code (no VEX/EVEX,
 * no x87, no lock or address-size prefix, no system or indirect-flow instruction). It stops
 * before the first instruction it does not know, at a byte the state map says was decoded before,
 * or after a direct branch, call or return, and hands the rest to the iced-x86 path of
 * `x86.X86Backend.decode_chunk`, which goes on from there. So the C path never has to be
 * complete, only right: `tests/test_x86scan.py` checks every instruction it accepts against
 * iced-x86 (length, flow, target, and that every instruction that may reference data is
 * flagged).
 *
 * Nothing here decides what a reference is: an instruction whose operand may hold an address
 * (RIP-relative memory, an absolute displacement or a 32/64-bit immediate inside [lo, hi)) is
 * only flagged, and iced-x86 decodes that one instruction for `X86Backend._data_ref`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* immediate kinds */
enum { I_NONE, I_B, I_W, I_Z, I_V, I_WB, I_MOFFS, I_GRP3 };
/* flow of an accepted instruction */
enum { FL_NEXT, FL_JCC, FL_JMP, FL_CALL, FL_RET };
/* ModRM operand restrictions */
enum { M_ANY, M_MEM, M_REG };
/* mandatory prefix, as a bit: none, 66, F3, F2 */
enum { P_NP = 1, P_66 = 2, P_F3 = 4, P_F2 = 8, P_ALL = 15, P_SSE2 = P_NP | P_66 };

typedef struct {
    uint8_t ok;    /* known here */
    uint8_t modrm; /* has a ModRM byte */
    uint8_t imm;   /* I_* */
    uint8_t flow;  /* FL_* */
    uint8_t pfx;   /* allowed mandatory prefixes (0F maps); map 0: whether 66 is allowed (P_66) */
    uint8_t regs;  /* allowed ModRM.reg values, a bit each */
    uint8_t mod;   /* M_* */
    uint8_t rel;   /* relative branch operand size: 0, 1 or 4 */
    uint8_t lock;  /* ModRM.reg values that take a `lock` prefix (with a memory operand) */
    uint8_t vl;    /* VEX: allowed VEX.L values, a bit each */
    uint8_t vw;    /* VEX: allowed VEX.W values, a bit each */
    uint8_t v1111; /* VEX: VEX.vvvv names no register and must be 1111b */
} op_t;

/* maps: 0 one-byte, 1 0F, 2 0F38, 3 0F3A; each table per operating mode (0 32-bit, 1 64-bit) */
static op_t tab[2][4][256];
/* VEX-encoded instructions (64-bit mode only), by map; `pfx` holds the allowed VEX.pp */
static op_t vtab[4][256];

/* a VEX instruction: map, opcode, VEX.pp allowed, VEX.L allowed (bit 0: L0, bit 1: L1), whether
 * vvvv must be 1111b, an imm8, ModRM restriction; VEX.W either value unless `vw` is given */
static void vex(int map, int op, int pfx, int lmask, int v1111, int imm, int mod) {
    op_t *e = &vtab[map][op];
    e->ok = 1;
    e->modrm = 1;
    e->imm = (uint8_t)imm;
    e->flow = FL_NEXT;
    e->pfx = (uint8_t)pfx;
    e->regs = 0xFF;
    e->mod = (uint8_t)mod;
    e->vl = (uint8_t)lmask;
    e->vw = 3;
    e->v1111 = (uint8_t)v1111;
}

static void init_vex(void) {
    memset(vtab, 0, sizeof vtab);
    const int L01 = 3, L0 = 1, L1 = 2;
    /* 0F: moves, compares, logic, integer arithmetic of AVX/AVX2 string and memory routines */
    vex(1, 0x10, P_NP | P_66, L01, 1, I_NONE, M_ANY); /* vmovups/pd */
    vex(1, 0x11, P_NP | P_66, L01, 1, I_NONE, M_ANY);
    vex(1, 0x28, P_NP | P_66, L01, 1, I_NONE, M_ANY); /* vmovaps/pd */
    vex(1, 0x29, P_NP | P_66, L01, 1, I_NONE, M_ANY);
    vex(1, 0x6F, P_66 | P_F3, L01, 1, I_NONE, M_ANY); /* vmovdqa/u */
    vex(1, 0x7F, P_66 | P_F3, L01, 1, I_NONE, M_ANY);
    vex(1, 0x6E, P_66, L0, 1, I_NONE, M_ANY); /* vmovd/q xmm, r/m */
    vex(1, 0x7E, P_66 | P_F3, L0, 1, I_NONE, M_ANY);
    vex(1, 0xD6, P_66, L0, 1, I_NONE, M_ANY);
    vex(1, 0xD7, P_66, L01, 1, I_NONE, M_REG); /* vpmovmskb */
    vex(1, 0x70, P_66 | P_F3 | P_F2, L01, 1, I_B, M_ANY); /* vpshufd/hw/lw */
    for (int op = 0x54; op < 0x58; op++) /* vand/andn/or/xor ps/pd */
        vex(1, op, P_NP | P_66, L01, 0, I_NONE, M_ANY);
    for (int op = 0x60; op < 0x6E; op++) /* vpunpck, vpack, vpcmpgt */
        vex(1, op, P_66, L01, 0, I_NONE, M_ANY);
    for (int op = 0x74; op < 0x77; op++) /* vpcmpeq */
        vex(1, op, P_66, L01, 0, I_NONE, M_ANY);
    vex(1, 0x77, P_NP, L01, 1, I_NONE, M_ANY); /* vzeroupper (L0), vzeroall (L1): no ModRM */
    vtab[1][0x77].modrm = 0;
    for (int op = 0xD8; op < 0x100; op++) { /* vpsubus .. vpaddd */
        if (op == 0xE6 || op == 0xE7 || op == 0xF0 || op == 0xF7 || op == 0xFF || (op >= 0xE0 && op <= 0xE5) ||
            (op >= 0xF1 && op <= 0xF6))
            continue;
        vex(1, op, P_66, L01, 0, I_NONE, M_ANY);
    }
    /* 0F38 */
    vex(2, 0x00, P_66, L01, 0, I_NONE, M_ANY); /* vpshufb */
    vex(2, 0x17, P_66, L01, 1, I_NONE, M_ANY); /* vptest */
    for (int op = 0x38; op < 0x40; op++)       /* vpmin/vpmax */
        vex(2, op, P_66, L01, 0, I_NONE, M_ANY);
    vex(2, 0x78, P_66, L01, 1, I_NONE, M_ANY); /* vpbroadcastb/w */
    vex(2, 0x79, P_66, L01, 1, I_NONE, M_ANY);
    vtab[2][0x78].vw = vtab[2][0x79].vw = 1; /* W0 */
    /* 0F3A */
    vex(3, 0x0F, P_66, L01, 0, I_B, M_ANY); /* vpalignr */
    vex(3, 0x38, P_66, L1, 0, I_B, M_ANY);  /* vinserti128 */
    vex(3, 0x39, P_66, L1, 1, I_B, M_ANY);  /* vextracti128 */
    vtab[3][0x38].vw = vtab[3][0x39].vw = 1;
}

static void set(int x64, int map, int op, int modrm, int imm, int pfx) {
    op_t *e = &tab[x64][map][op];
    e->ok = 1;
    e->modrm = (uint8_t)modrm;
    e->imm = (uint8_t)imm;
    e->flow = FL_NEXT;
    e->pfx = (uint8_t)pfx;
    e->regs = 0xFF;
    e->mod = M_ANY;
    e->rel = 0;
    e->lock = 0;
}

static void lockable(int map, int op, int regs) {
    tab[0][map][op].lock = (uint8_t)regs;
    tab[1][map][op].lock = (uint8_t)regs;
}

static void both(int map, int op, int modrm, int imm, int pfx) {
    set(0, map, op, modrm, imm, pfx);
    set(1, map, op, modrm, imm, pfx);
}

static void restrict_op(int map, int op, int regs, int mod) {
    for (int m = 0; m < 2; m++) {
        tab[m][map][op].regs = (uint8_t)regs;
        tab[m][map][op].mod = (uint8_t)mod;
    }
}

static void branch(int map, int op, int flow, int rel, int imm) {
    both(map, op, 0, imm, P_NP | P_F3 | P_F2);
    for (int m = 0; m < 2; m++) {
        tab[m][map][op].flow = (uint8_t)flow;
        tab[m][map][op].rel = (uint8_t)rel;
    }
}

static void init_tables(void) {
    memset(tab, 0, sizeof tab);
    /* ---- one-byte map ---- */
    for (int g = 0; g < 8; g++) { /* add or adc sbb and sub xor cmp */
        int b = g * 8;
        for (int k = 0; k < 4; k++)
            both(0, b + k, 1, I_NONE, P_ALL);
        both(0, b + 4, 0, I_B, P_ALL);
        both(0, b + 5, 0, I_Z, P_ALL);
    }
    for (int op = 0x40; op < 0x50; op++) /* inc/dec r32 (32-bit mode only: REX in 64-bit) */
        set(0, 0, op, 0, I_NONE, P_ALL);
    for (int op = 0x50; op < 0x60; op++) /* push/pop r */
        both(0, op, 0, I_NONE, P_ALL);
    set(1, 0, 0x63, 1, I_NONE, P_ALL); /* movsxd */
    both(0, 0x68, 0, I_Z, P_ALL);      /* push imm */
    both(0, 0x69, 1, I_Z, P_ALL);      /* imul r, r/m, imm */
    both(0, 0x6A, 0, I_B, P_ALL);
    both(0, 0x6B, 1, I_B, P_ALL);
    for (int op = 0x70; op < 0x80; op++)
        branch(0, op, FL_JCC, 1, I_NONE);
    both(0, 0x80, 1, I_B, P_ALL);
    both(0, 0x81, 1, I_Z, P_ALL);
    both(0, 0x83, 1, I_B, P_ALL);
    for (int op = 0x84; op < 0x8C; op++) /* test xchg mov */
        both(0, op, 1, I_NONE, P_ALL);
    both(0, 0x8D, 1, I_NONE, P_ALL); /* lea: memory only */
    restrict_op(0, 0x8D, 0xFF, M_MEM);
    both(0, 0x8F, 1, I_NONE, P_ALL); /* pop r/m: /0 only (others are XOP) */
    restrict_op(0, 0x8F, 0x01, M_ANY);
    for (int op = 0x90; op < 0x9A; op++) /* xchg/nop/pause, cwde, cdq */
        both(0, op, 0, I_NONE, P_ALL);
    both(0, 0x9C, 0, I_NONE, P_ALL); /* pushf, popf */
    both(0, 0x9D, 0, I_NONE, P_ALL);
    for (int op = 0xA0; op < 0xA4; op++) /* mov al/eax <-> moffs */
        both(0, op, 0, I_MOFFS, P_ALL);
    for (int op = 0xA4; op < 0xB0; op++) /* string instructions, test al/eax, imm */
        both(0, op, 0, I_NONE, P_ALL);
    both(0, 0xA8, 0, I_B, P_ALL);
    both(0, 0xA9, 0, I_Z, P_ALL);
    for (int op = 0xB0; op < 0xB8; op++)
        both(0, op, 0, I_B, P_ALL);
    for (int op = 0xB8; op < 0xC0; op++)
        both(0, op, 0, I_V, P_ALL);
    both(0, 0xC0, 1, I_B, P_ALL); /* shift groups */
    both(0, 0xC1, 1, I_B, P_ALL);
    branch(0, 0xC2, FL_RET, 0, I_W);
    branch(0, 0xC3, FL_RET, 0, I_NONE);
    both(0, 0xC6, 1, I_B, P_ALL); /* mov r/m, imm: /0 only (C6 F8 is xabort, C7 F8 xbegin) */
    restrict_op(0, 0xC6, 0x01, M_ANY);
    both(0, 0xC7, 1, I_Z, P_ALL);
    restrict_op(0, 0xC7, 0x01, M_ANY);
    both(0, 0xC8, 0, I_WB, P_ALL); /* enter, leave */
    both(0, 0xC9, 0, I_NONE, P_ALL);
    for (int op = 0xD0; op < 0xD4; op++)
        both(0, op, 1, I_NONE, P_ALL);
    branch(0, 0xE8, FL_CALL, 4, I_NONE);
    branch(0, 0xE9, FL_JMP, 4, I_NONE);
    branch(0, 0xEB, FL_JMP, 1, I_NONE);
    both(0, 0xF5, 0, I_NONE, P_ALL); /* cmc */
    both(0, 0xF6, 1, I_GRP3, P_ALL);
    both(0, 0xF7, 1, I_GRP3, P_ALL);
    for (int op = 0xF8; op < 0xFE; op++) /* clc stc cli sti cld std */
        both(0, op, 0, I_NONE, P_ALL);
    both(0, 0xFE, 1, I_NONE, P_ALL); /* inc/dec r/m8 */
    restrict_op(0, 0xFE, 0x03, M_ANY);
    both(0, 0xFF, 1, I_NONE, P_ALL); /* inc, dec, push r/m (calls and jumps go to iced) */
    restrict_op(0, 0xFF, 0x43, M_ANY);

    /* ---- 0F map ---- */
    int all = P_ALL, sse = P_SSE2;
    both(1, 0x10, 1, I_NONE, all); /* movups/pd/ss/sd */
    both(1, 0x11, 1, I_NONE, all);
    both(1, 0x14, 1, I_NONE, sse); /* unpcklps/pd, unpckhps/pd */
    both(1, 0x15, 1, I_NONE, sse);
    both(1, 0x13, 1, I_NONE, sse); /* movlps/pd m, x; movhps/pd m, x */
    restrict_op(1, 0x13, 0xFF, M_MEM);
    both(1, 0x17, 1, I_NONE, sse);
    restrict_op(1, 0x17, 0xFF, M_MEM);
    both(1, 0x1F, 1, I_NONE, sse); /* nop r/m */
    both(1, 0x1E, 1, I_NONE, P_F3); /* endbr64/endbr32 only (checked in decode) */
    both(1, 0x28, 1, I_NONE, sse);  /* movaps/pd */
    both(1, 0x29, 1, I_NONE, sse);
    both(1, 0x2A, 1, I_NONE, all);
    both(1, 0x2C, 1, I_NONE, all);
    both(1, 0x2D, 1, I_NONE, all);
    both(1, 0x2E, 1, I_NONE, sse); /* ucomis, comis */
    both(1, 0x2F, 1, I_NONE, sse);
    for (int op = 0x40; op < 0x50; op++) /* cmovcc */
        both(1, op, 1, I_NONE, sse);
    both(1, 0x51, 1, I_NONE, all); /* sqrt */
    for (int op = 0x54; op < 0x58; op++) /* and andn or xor ps/pd */
        both(1, op, 1, I_NONE, sse);
    for (int op = 0x58; op < 0x60; op++) /* add mul cvt sub min div max */
        both(1, op, 1, I_NONE, all);
    both(1, 0x5B, 1, I_NONE, P_NP | P_66 | P_F3);
    for (int op = 0x60; op < 0x6C; op++) /* punpck, pack, pcmpgt */
        both(1, op, 1, I_NONE, sse);
    both(1, 0x6C, 1, I_NONE, P_66);
    both(1, 0x6D, 1, I_NONE, P_66);
    both(1, 0x6E, 1, I_NONE, sse); /* movd/movq */
    both(1, 0x6F, 1, I_NONE, P_NP | P_66 | P_F3);
    both(1, 0x70, 1, I_B, all); /* pshufw/d/hw/lw */
    for (int op = 0x74; op < 0x77; op++) /* pcmpeq */
        both(1, op, 1, I_NONE, sse);
    both(1, 0x7E, 1, I_NONE, P_NP | P_66 | P_F3);
    both(1, 0x7F, 1, I_NONE, P_NP | P_66 | P_F3);
    for (int op = 0x80; op < 0x90; op++)
        branch(1, op, FL_JCC, 4, I_NONE);
    for (int op = 0x90; op < 0xA0; op++) /* setcc */
        both(1, op, 1, I_NONE, P_NP);
    both(1, 0xA2, 0, I_NONE, P_NP); /* cpuid */
    both(1, 0xA3, 1, I_NONE, sse);  /* bt bts btr btc */
    both(1, 0xAB, 1, I_NONE, sse);
    both(1, 0xB3, 1, I_NONE, sse);
    both(1, 0xBB, 1, I_NONE, sse);
    both(1, 0xA4, 1, I_B, sse); /* shld/shrd */
    both(1, 0xAC, 1, I_B, sse);
    both(1, 0xA5, 1, I_NONE, sse);
    both(1, 0xAD, 1, I_NONE, sse);
    both(1, 0xAF, 1, I_NONE, sse); /* imul */
    both(1, 0xB0, 1, I_NONE, sse); /* cmpxchg */
    both(1, 0xB1, 1, I_NONE, sse);
    both(1, 0xB6, 1, I_NONE, sse); /* movzx, movsx */
    both(1, 0xB7, 1, I_NONE, sse);
    both(1, 0xBE, 1, I_NONE, sse);
    both(1, 0xBF, 1, I_NONE, sse);
    both(1, 0xB8, 1, I_NONE, P_F3); /* popcnt */
    both(1, 0xBA, 1, I_B, sse);     /* bt group: /4-/7 */
    restrict_op(1, 0xBA, 0xF0, M_ANY);
    both(1, 0xBC, 1, I_NONE, P_NP | P_66 | P_F3); /* bsf/tzcnt, bsr/lzcnt */
    both(1, 0xBD, 1, I_NONE, P_NP | P_66 | P_F3);
    both(1, 0xC0, 1, I_NONE, sse); /* xadd */
    both(1, 0xC1, 1, I_NONE, sse);
    both(1, 0xC2, 1, I_B, all); /* cmpps/pd/ss/sd */
    both(1, 0xC6, 1, I_B, sse); /* shufps/pd */
    for (int op = 0xC8; op < 0xD0; op++) /* bswap */
        both(1, op, 0, I_NONE, P_NP);
    for (int op = 0xD1; op < 0x100; op++) { /* MMX/SSE2 integer arithmetic */
        if (op == 0xD6 || op == 0xD7 || op == 0xE6 || op == 0xE7 || op == 0xF0 || op == 0xF7 || op == 0xFF)
            continue;
        both(1, op, 1, I_NONE, sse);
    }
    both(1, 0xD6, 1, I_NONE, P_66); /* movq xmm/m64, xmm */
    both(1, 0xE7, 1, I_NONE, sse);  /* movntq/movntdq */
    restrict_op(1, 0xE7, 0xFF, M_MEM);

    both(1, 0xD7, 1, I_NONE, sse); /* pmovmskb */
    restrict_op(1, 0xD7, 0xFF, M_REG);
    both(1, 0x71, 1, I_B, sse); /* shifts by an immediate (0F 73 /3 and /7 need 66: see decode) */
    restrict_op(1, 0x71, 0x54, M_REG);
    both(1, 0x72, 1, I_B, sse);
    restrict_op(1, 0x72, 0x54, M_REG);
    both(1, 0x73, 1, I_B, sse);
    restrict_op(1, 0x73, 0xCC, M_REG);
    set(1, 1, 0x05, 0, I_NONE, P_NP); /* syscall: iced's flow is CALL, without a target: the chunk goes on */

    /* `lock` with a memory destination: add or adc sbb and sub xor (not cmp), xchg, inc/dec,
     * not/neg, bts/btr/btc, cmpxchg, xadd */
    for (int g = 0; g < 7; g++) {
        lockable(0, g * 8, 0xFF);
        lockable(0, g * 8 + 1, 0xFF);
    }
    lockable(0, 0x80, 0x7F);
    lockable(0, 0x81, 0x7F);
    lockable(0, 0x83, 0x7F);
    lockable(0, 0x86, 0xFF);
    lockable(0, 0x87, 0xFF);
    lockable(0, 0xF6, 0x0C);
    lockable(0, 0xF7, 0x0C);
    lockable(0, 0xFE, 0x03);
    lockable(0, 0xFF, 0x03);
    lockable(1, 0xAB, 0xFF);
    lockable(1, 0xB3, 0xFF);
    lockable(1, 0xBB, 0xFF);
    lockable(1, 0xBA, 0xE0);
    lockable(1, 0xB0, 0xFF);
    lockable(1, 0xB1, 0xFF);
    lockable(1, 0xC0, 0xFF);
    lockable(1, 0xC1, 0xFF);

    /* ---- 0F38 and 0F3A: the SSSE3/SSE4 instructions of string and memory routines ---- */
    for (int op = 0x00; op < 0x0C; op++) /* pshufb .. pmulhrsw */
        both(2, op, 1, I_NONE, sse);
    for (int op = 0x1C; op < 0x1F; op++) /* pabs */
        both(2, op, 1, I_NONE, sse);
    both(2, 0x17, 1, I_NONE, P_66); /* ptest */
    for (int op = 0x20; op < 0x26; op++) /* pmovsx */
        both(2, op, 1, I_NONE, P_66);
    for (int op = 0x30; op < 0x36; op++) /* pmovzx */
        both(2, op, 1, I_NONE, P_66);
    for (int op = 0x37; op < 0x41; op++) /* pcmpgtq, pmin/pmax, pmulld */
        both(2, op, 1, I_NONE, P_66);
    both(2, 0x28, 1, I_NONE, P_66); /* pmuldq, pcmpeqq, packusdw */
    both(2, 0x29, 1, I_NONE, P_66);
    both(2, 0x2B, 1, I_NONE, P_66);
    both(3, 0x0F, 1, I_B, sse); /* palignr */
    for (int op = 0x08; op < 0x0F; op++) /* round, blend */
        both(3, op, 1, I_B, P_66);
    for (int op = 0x60; op < 0x64; op++) /* pcmpestrm .. pcmpistri */
        both(3, op, 1, I_B, P_66);
}

typedef struct {
    int len;
    int flow;
    uint64_t target;
    int flagged; /* an operand may hold an address in [lo, hi) (or is RIP-relative) */
} insn_t;

static inline int is_legacy_prefix(uint8_t b) {
    return b == 0x66 || b == 0x67 || b == 0xF0 || b == 0xF2 || b == 0xF3 || b == 0x2E || b == 0x3E ||
           b == 0x26 || b == 0x36 || b == 0x64 || b == 0x65;
}

static inline int in_range(uint64_t v, uint64_t lo, uint64_t hi) { return lo <= v && v < hi; }

static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Decode one instruction at p (n bytes available). Returns its length, or 0 when it is not one
 * this file knows exactly. */
static int decode(const uint8_t *p, Py_ssize_t n, int x64, uint64_t va, uint64_t lo, uint64_t hi, insn_t *d) {
    int i = 0, max = n < 15 ? (int)n : 15;
    int o16 = 0, rep = 0, rexw = 0, lock = 0, rex = 0;
    uint8_t b;
    for (;;) {
        if (i >= max)
            return 0;
        b = p[i];
        if (b == 0x66) {
            o16 = 1;
        } else if (b == 0xF2 || b == 0xF3) {
            if (rep && rep != b)
                return 0;
            rep = b;
        } else if (b == 0xF0) {
            lock = 1;
        } else if (b == 0x67) {
            return 0;
        } else if (!(b == 0x2E || b == 0x3E || b == 0x26 || b == 0x36 || b == 0x64 || b == 0x65)) {
            break;
        }
        i++;
    }
    if (x64 && (b & 0xF0) == 0x40) {
        rex = 1;
        rexw = (b >> 3) & 1;
        if (++i >= max)
            return 0;
        b = p[i];
        if ((b & 0xF0) == 0x40 || is_legacy_prefix(b))
            return 0;
    }
    int map = 0, op = p[i++], isvex = 0, vl = 0, vw = 0, vvvv = 0, vpp = 0;
    if (x64 && (op == 0xC5 || op == 0xC4)) { /* VEX: no legacy or REX prefix may come before */
        if (o16 || rep || lock || rex || i + (op == 0xC4 ? 2 : 1) >= max)
            return 0;
        uint8_t v2 = p[i++];
        map = 1;
        if (op == 0xC4) {
            map = v2 & 0x1F;
            if (map < 1 || map > 3)
                return 0;
            v2 = p[i++];
            vw = v2 >> 7;
        }
        vvvv = (~v2 >> 3) & 15;
        vl = (v2 >> 2) & 1;
        vpp = v2 & 3;
        op = p[i++];
        isvex = 1;
    } else if (op == 0x0F) {
        if (i >= max)
            return 0;
        op = p[i++];
        map = 1;
        if (op == 0x38 || op == 0x3A) {
            if (i >= max)
                return 0;
            map = op == 0x38 ? 2 : 3;
            op = p[i++];
        }
    }
    const op_t *e = isvex ? &vtab[map][op] : &tab[x64][map][op];
    if (!e->ok)
        return 0;
    if (isvex) {
        static const int pp_bit[4] = {P_NP, P_66, P_F3, P_F2};
        if (!(e->pfx & pp_bit[vpp]) || !(e->vl >> vl & 1) || !(e->vw >> vw & 1) || (e->v1111 && vvvv))
            return 0;
    } else if (map) {
        int mp;
        if (rep && o16)
            return 0;
        mp = rep == 0xF3 ? P_F3 : rep == 0xF2 ? P_F2 : o16 ? P_66 : P_NP;
        if (!(e->pfx & mp))
            return 0;
    } else if (o16 && !(e->pfx & P_66)) {
        return 0;
    }
    if (e->rel && o16)
        return 0;
    int reg = 0, flagged = 0;
    if (lock && !e->modrm)
        return 0;
    if (e->modrm) {
        if (i >= max)
            return 0;
        uint8_t m = p[i++];
        int mod = m >> 6, rm = m & 7;
        reg = (m >> 3) & 7;
        if (!(e->regs >> reg & 1))
            return 0;
        if ((e->mod == M_MEM && mod == 3) || (e->mod == M_REG && mod != 3))
            return 0;
        if (lock && (mod == 3 || !(e->lock >> reg & 1)))
            return 0;
        if (map == 1 && op == 0x73 && !o16 && (reg == 3 || reg == 7))
            return 0; /* psrldq/pslldq: 66 only */
        if (map == 1 && op == 0x1E && !(mod == 3 && reg == 7 && (rm == 2 || rm == 3)))
            return 0; /* F3 0F 1E FA/FB: endbr64/endbr32 */
        if (mod != 3) {
            int absolute = 0, rip = 0;
            if (rm == 4) {
                if (i >= max)
                    return 0;
                uint8_t sib = p[i++];
                if (mod == 0 && (sib & 7) == 5)
                    absolute = 1;
            } else if (mod == 0 && rm == 5) {
                if (x64)
                    rip = 1;
                else
                    absolute = 1;
            }
            if (mod == 1) {
                i += 1;
            } else if (mod == 2 || absolute || rip) {
                if (i + 4 > max)
                    return 0;
                if (rip) {
                    flagged = 1;
                } else if (absolute) {
                    uint32_t v = rd32(p + i);
                    flagged = in_range(v, lo, hi) || in_range((uint64_t)(int64_t)(int32_t)v, lo, hi);
                }
                i += 4;
            }
        }
    }
    int isz = 0;
    switch (e->imm) {
    case I_B:
        isz = 1;
        break;
    case I_W:
        isz = 2;
        break;
    case I_WB:
        isz = 3;
        break;
    case I_Z:
        isz = o16 && !rexw ? 2 : 4;
        break;
    case I_V:
        isz = rexw ? 8 : o16 ? 2 : 4;
        break;
    case I_MOFFS:
        isz = x64 ? 8 : 4;
        break;
    case I_GRP3:
        isz = reg >= 2 ? 0 : op == 0xF6 ? 1 : (o16 && !rexw ? 2 : 4);
        break;
    }
    if (i + isz + e->rel > max)
        return 0;
    if (isz == 4) {
        uint32_t v = rd32(p + i);
        if (in_range(v, lo, hi) || in_range((uint64_t)(int64_t)(int32_t)v, lo, hi))
            flagged = 1;
    } else if (isz == 8) {
        uint64_t v = (uint64_t)rd32(p + i) | (uint64_t)rd32(p + i + 4) << 32;
        if (in_range(v, lo, hi))
            flagged = 1;
    }
    i += isz;
    d->flow = e->flow;
    d->target = 0;
    if (e->rel) {
        int64_t rel = e->rel == 1 ? (int64_t)(int8_t)p[i] : (int64_t)(int32_t)rd32(p + i);
        i += e->rel;
        uint64_t t = va + (uint64_t)i + (uint64_t)rel;
        d->target = x64 ? t : (t & 0xFFFFFFFFu);
    }
    d->len = i;
    d->flagged = flagged;
    return i;
}

enum { M_INSN = 1, M_BODY = 2 };
enum { K_FALL = 5, K_BAD = 6 }; /* chunk ends that are not an instruction's (after FL_*) */

/* the engine's terminator codes (model.T_*), set by `configure` */
static long t_cond, t_jump, t_call, t_ret, t_fall, t_bad;
static int configured;

static PyObject *configure(PyObject *self, PyObject *args) {
    (void)self;
    if (!PyArg_ParseTuple(args, "llllll", &t_cond, &t_jump, &t_call, &t_ret, &t_fall, &t_bad))
        return NULL;
    configured = 1;
    Py_RETURN_NONE;
}

static int add_ref(PyObject **refs, Py_ssize_t off) {
    if (*refs == NULL && (*refs = PyList_New(0)) == NULL)
        return -1;
    PyObject *o = PyLong_FromSsize_t(off);
    if (o == NULL)
        return -1;
    int rc = PyList_Append(*refs, o);
    Py_DECREF(o);
    return rc;
}

/* the state bytes of the instructions from off0 to off (1 at a start, 2 under the rest) */
static void put_marks(uint8_t *m, const uint8_t *p, Py_ssize_t n, Py_ssize_t off0, Py_ssize_t off, int x64) {
    memset(m, M_BODY, (size_t)(off - off0));
    for (Py_ssize_t k = off0; k < off;) {
        insn_t d;
        int len = decode(p + k, n - k, x64, 0, 0, 0, &d); /* known to decode: it did a moment ago */
        m[k - off0] = M_INSN;
        k += len;
    }
}

typedef struct {
    Py_ssize_t off;  /* where the walk stopped (the chunk's end when kind != 0) */
    uint64_t cur;    /* its address */
    uint64_t last;   /* the address of the last instruction decoded */
    uint64_t target; /* the branch target (kind FL_JCC, FL_JMP, FL_CALL) */
    int kind;        /* 0: an instruction not known here; else FL_JCC..FL_RET, K_FALL, K_BAD */
} walk_t;

/* Walk the plain instructions from `off`; the offsets of those that may reference data are
 * appended to *refs (a list made on first need). -1 with an exception set on failure. */
static int walk(const uint8_t *p, const uint8_t *st, Py_ssize_t n, Py_ssize_t off, uint64_t va, int x64, uint64_t lo,
                uint64_t hi, int min_ref, PyObject **refs, walk_t *w) {
    uint64_t cur = va, last = va;
    w->kind = 0;
    w->target = 0;
    while (off < n && st[off] == 0) {
        insn_t d;
        int len = decode(p + off, n - off, x64, cur, lo, hi, &d);
        if (!len)
            break;
        if (d.flagged && len >= min_ref && add_ref(refs, off) < 0)
            return -1;
        last = cur;
        cur += (uint64_t)len;
        off += len;
        if (d.flow != FL_NEXT) {
            w->kind = d.flow;
            w->target = d.target;
            break;
        }
    }
    /* (addresses run on past 4 GiB in 32-bit code as in the iced path: only branch targets wrap) */
    if (!w->kind && (off >= n || st[off] != 0)) /* the region ends, or code decoded before begins */
        w->kind = off < n && st[off] != M_BODY ? K_FALL : K_BAD;
    w->off = off;
    w->cur = cur;
    w->last = last;
    return 0;
}

/* Are the state bytes under [off0, off) all unexplored (no instruction runs into earlier code)? */
static int unexplored(const uint8_t *st, Py_ssize_t off0, Py_ssize_t off) {
    for (Py_ssize_t k = off0; k < off; k++)
        if (st[k])
            return 0;
    return 1;
}

/* `decode_chunk`'s (end, terminator, targets, last) for a walk that ended the chunk; the end is
 * one int object wherever it appears (also as the fall-through target): 80k chunks on libc */
static PyObject *chunk_tuple(const walk_t *w) {
    PyObject *cur = PyLong_FromUnsignedLongLong(w->cur), *last = PyLong_FromUnsignedLongLong(w->last);
    PyObject *target = NULL, *targets = NULL, *out = NULL;
    long term;
    if (cur == NULL || last == NULL)
        goto done;
    switch (w->kind) {
    case FL_JCC:
    case FL_CALL:
        term = w->kind == FL_JCC ? t_cond : t_call;
        target = PyLong_FromUnsignedLongLong(w->target);
        targets = target ? PyTuple_Pack(2, target, cur) : NULL;
        break;
    case FL_JMP:
        term = t_jump;
        target = PyLong_FromUnsignedLongLong(w->target);
        targets = target ? PyTuple_Pack(1, target) : NULL;
        break;
    case K_FALL:
        term = t_fall;
        targets = PyTuple_Pack(1, cur);
        break;
    default:
        term = w->kind == FL_RET ? t_ret : t_bad;
        targets = PyTuple_New(0);
    }
    if (targets != NULL)
        out = Py_BuildValue("(OlOO)", cur, term, targets, last);
done:
    Py_XDECREF(cur);
    Py_XDECREF(last);
    Py_XDECREF(target);
    Py_XDECREF(targets);
    return out;
}

/* scan(data, state, off, va, bits, lo, hi, min_ref): the chunk at `off` (address `va`).
 *
 * When it ends here (a direct branch, call or return, the region's end, or code decoded before)
 * and none of its bytes was decoded before, the state map is written (instruction marks, the
 * chunk start) and the answer is `decode_chunk`'s (end, terminator, targets, last), or
 * ((end, terminator, targets, last), refs) when some instructions may reference data. When one of
 * its bytes was decoded before, nothing is written and the answer is None (the exact path redoes
 * it). Otherwise the iced path goes on: (off, va, last, marks, refs) say where, the address of the
 * last instruction decoded here, their state bytes and the offsets of those that may reference
 * data. */
static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer data, state;
    Py_ssize_t off;
    unsigned long long va, lo, hi;
    int bits, min_ref;
    (void)self;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_x86scan.configure() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*w*nKiKKi", &data, &state, &off, &va, &bits, &lo, &hi, &min_ref))
        return NULL;
    const uint8_t *p = data.buf;
    uint8_t *st = state.buf;
    Py_ssize_t n = data.len < state.len ? data.len : state.len;
    int x64 = bits == 64;
    PyObject *refs = NULL, *out = NULL;
    walk_t w;
    if (off < 0 || off >= n) {
        PyErr_SetString(PyExc_ValueError, "offset outside the region");
        goto done;
    }
    if (walk(p, st, n, off, va, x64, lo, hi, min_ref, &refs, &w) < 0)
        goto done;
    if (!w.kind) { /* the iced path goes on */
        PyObject *marks = PyBytes_FromStringAndSize(NULL, w.off - off);
        if (marks == NULL)
            goto done;
        put_marks((uint8_t *)PyBytes_AS_STRING(marks), p, n, off, w.off, x64);
        PyObject *found = refs ? Py_NewRef(refs) : PyTuple_New(0);
        out = Py_BuildValue("nKKNN", w.off, (unsigned long long)w.cur, (unsigned long long)w.last, marks, found);
        goto done;
    }
    if (!unexplored(st, off, w.off)) { /* an instruction runs into code decoded before */
        out = Py_NewRef(Py_None);
        goto done;
    }
    put_marks(st + off, p, n, off, w.off, x64);
    st[off] = 3; /* codemap.CHUNK */
    out = chunk_tuple(&w);
    if (out != NULL && refs != NULL)
        out = Py_BuildValue("(NO)", out, refs);
done:
    Py_XDECREF(refs);
    PyBuffer_Release(&data);
    PyBuffer_Release(&state);
    return out;
}

/* ---- Scanner: the same over a code map's regions, one call per chunk ---- */
typedef struct {
    PyObject_HEAD
    Py_ssize_t nreg, hit;
    uint64_t *rva;    /* region start addresses, ascending */
    PyObject **data;  /* bytes */
    PyObject **state; /* bytearray, never resized (codemap.CodeRegion.state) */
    int x64, min_ref;
    uint64_t lo, hi;
    PyObject *on_ref; /* called with the address of each instruction that may reference data */
} Scanner;

/* The scanner holds `on_ref`, the backend's bound method, and the backend holds the scanner: a
 * cycle, which the collector frees only if it can see the scanner's reference. */
static int scanner_traverse(Scanner *s, visitproc visit, void *arg) {
    Py_VISIT(s->on_ref);
    return 0;
}

static int scanner_clear(Scanner *s) {
    Py_CLEAR(s->on_ref);
    return 0;
}

static void scanner_free(Scanner *s) {
    PyObject_GC_UnTrack(s);
    for (Py_ssize_t i = 0; i < s->nreg; i++) {
        Py_XDECREF(s->data[i]);
        Py_XDECREF(s->state[i]);
    }
    PyMem_Free(s->rva);
    PyMem_Free(s->data);
    PyMem_Free(s->state);
    Py_XDECREF(s->on_ref);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *scanner_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *regions, *on_ref;
    int bits, min_ref;
    unsigned long long lo, hi;
    (void)kw;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_x86scan.configure() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!iKKiO", &PyList_Type, &regions, &bits, &lo, &hi, &min_ref, &on_ref))
        return NULL;
    Scanner *s = (Scanner *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(regions);
    s->rva = PyMem_Calloc((size_t)n + 1, sizeof *s->rva);
    s->data = PyMem_Calloc((size_t)n + 1, sizeof *s->data);
    s->state = PyMem_Calloc((size_t)n + 1, sizeof *s->state);
    s->x64 = bits == 64;
    s->lo = lo;
    s->hi = hi;
    s->min_ref = min_ref;
    s->on_ref = Py_NewRef(on_ref);
    if (s->rva == NULL || s->data == NULL || s->state == NULL) {
        scanner_free(s);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *va, *data, *state;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(regions, i), "OO!O!", &va, &PyBytes_Type, &data, &PyByteArray_Type,
                              &state)) {
            scanner_free(s);
            return NULL;
        }
        s->rva[i] = PyLong_AsUnsignedLongLong(va);
        if (PyErr_Occurred() || (i > 0 && s->rva[i] < s->rva[i - 1])) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "regions must be in address order");
            scanner_free(s);
            return NULL;
        }
        s->data[i] = Py_NewRef(data);
        s->state[i] = Py_NewRef(state);
        s->nreg = i + 1;
    }
    return (PyObject *)s;
}

static inline Py_ssize_t region_len(const Scanner *s, Py_ssize_t i) {
    Py_ssize_t a = PyBytes_GET_SIZE(s->data[i]), b = PyByteArray_GET_SIZE(s->state[i]);
    return a < b ? a : b;
}

/* Scanner.chunk(va): the chunk at `va` as `decode_chunk` answers it, when it is decoded here
 * whole; False when the Python path has to decide (code decoded there before, an instruction
 * not known here, an overlap with earlier code); None outside every region. */
static PyObject *scanner_chunk(Scanner *s, PyObject *arg) {
    uint64_t va = PyLong_AsUnsignedLongLong(arg);
    if (va == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t i = s->hit;
    if (!(i < s->nreg && s->rva[i] <= va && va - s->rva[i] < (uint64_t)region_len(s, i))) {
        Py_ssize_t lo = 0, hi = s->nreg; /* the last region starting at or below va */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (s->rva[mid] <= va)
                lo = mid + 1;
            else
                hi = mid;
        }
        i = lo - 1;
        if (i < 0 || va - s->rva[i] >= (uint64_t)region_len(s, i))
            Py_RETURN_NONE;
        s->hit = i;
    }
    const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(s->data[i]);
    uint8_t *st = (uint8_t *)PyByteArray_AS_STRING(s->state[i]);
    Py_ssize_t n = region_len(s, i), off = (Py_ssize_t)(va - s->rva[i]);
    if (st[off])
        Py_RETURN_FALSE;
    PyObject *refs = NULL;
    walk_t w;
    if (walk(p, st, n, off, va, s->x64, s->lo, s->hi, s->min_ref, &refs, &w) < 0)
        return NULL;
    if (!w.kind || !unexplored(st, off, w.off)) {
        Py_XDECREF(refs);
        Py_RETURN_FALSE;
    }
    if (refs != NULL) { /* before the state is written: a failure leaves the chunk undecoded */
        if (s->on_ref == NULL) { /* (only after the collector cleared a scanner nothing reaches) */
            Py_DECREF(refs);
            PyErr_SetString(PyExc_RuntimeError, "the scanner was cleared");
            return NULL;
        }
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(refs); k++) {
            Py_ssize_t at = PyLong_AsSsize_t(PyList_GET_ITEM(refs, k));
            PyObject *addr = PyLong_FromUnsignedLongLong(s->rva[i] + (uint64_t)at);
            PyObject *r = addr ? PyObject_CallOneArg(s->on_ref, addr) : NULL;
            Py_XDECREF(addr);
            if (r == NULL) {
                Py_DECREF(refs);
                return NULL;
            }
            Py_DECREF(r);
        }
        Py_DECREF(refs);
    }
    put_marks(st + off, p, n, off, w.off, s->x64);
    st[off] = 3; /* codemap.CHUNK */
    return chunk_tuple(&w);
}

static PyMethodDef scanner_methods[] = {
    {"chunk", (PyCFunction)scanner_chunk, METH_O,
     "The chunk at an address, decoded here whole; False: the Python path decides; None: outside the regions."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "binlens.analysis.native._x86scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)scanner_traverse,
    .tp_clear = (inquiry)scanner_clear,
    .tp_doc = "Scanner(regions: [(va, data: bytes, state: bytearray)], bits, lo, hi, min_ref, on_ref)",
    .tp_new = scanner_new,
    .tp_dealloc = (destructor)scanner_free,
    .tp_methods = scanner_methods,
};

/* decode_one(data, off, va, bits, lo, hi) -> (length, flow, target, flagged) or None: what
 * `scan` makes of the one instruction at `off` (the test oracle's view of this file). */
static PyObject *decode_one(PyObject *self, PyObject *args) {
    Py_buffer data;
    Py_ssize_t off;
    unsigned long long va, lo, hi;
    int bits;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nKiKK", &data, &off, &va, &bits, &lo, &hi))
        return NULL;
    insn_t d;
    int len = off >= 0 && off < data.len ? decode((const uint8_t *)data.buf + off, data.len - off, bits == 64, va, lo, hi, &d) : 0;
    PyBuffer_Release(&data);
    if (!len)
        Py_RETURN_NONE;
    return Py_BuildValue("iiKi", len, d.flow, (unsigned long long)d.target, d.flagged);
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "Set the engine's terminator codes: configure(cond, jump, call, ret, fall, bad)."},
    {"scan", scan, METH_VARARGS, "Decode the plain straight-line x86 code at an offset (see the module source)."},
    {"decode_one", decode_one, METH_VARARGS, "What scan makes of one instruction: (length, flow, target, flagged) or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_x86scan", "Plain x86/x86-64 chunk decoding in C (see decode/x86.py).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__x86scan(void) {
    init_tables();
    init_vex();
    if (PyType_Ready(&ScannerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "FLOW_NEXT", FL_NEXT) < 0 || PyModule_AddIntConstant(m, "FLOW_JCC", FL_JCC) < 0 ||
        PyModule_AddIntConstant(m, "FLOW_JMP", FL_JMP) < 0 || PyModule_AddIntConstant(m, "FLOW_CALL", FL_CALL) < 0 ||
        PyModule_AddIntConstant(m, "FLOW_RET", FL_RET) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
