"""Rewrite time and memory against file size: generated files of 1k..50k lines.

Five shapes per size: ``none`` (plain code, no candidate site), ``one`` (one GAE recurrence at
the top, the rest plain), ``sparse`` (a site every ~220 lines, as in a training script),
``mixed`` (a site every ~25 lines; the sites are target updates, GAE recurrences, reductions,
gradient-clip sites and elementwise loops, in turn) and ``loops`` (one function holding nothing
but GAE-style backward loops, one per 9 lines: per-loop checks that walked the whole function
made it quadratic, issue 19 item 13) and ``block`` (one training function of 16-line blocks, each
with sites of eight transforms, names reused from block to block: per-site checks that walked
the function made it quadratic too, 100 blocks 57 CPU s before the sixteenth session). ``loops`` on the loaded 2-core machine (CPU s, lines/s,
peak MB): 5k 17.0 (294/s, 330), 20k 82.5 (242/s, 1213), 50k 253 (198/s, 2934); before
recurrence/function_facts.py 5k took 194.8 CPU s. Then (issue 19 item 13, same machine, CPU s
before -> after): fresh names no longer retry every earlier suffix (``unique_name`` was quadratic
in sites), generated code is parsed once per shape and copied (analysis/cstclone.py), the loop
map walks statements only, hot.no_grad's callees gather a scope's assignments in one walk:
loops 5k 22.2 -> 13.8, 20k 82.5 -> 57.3, 50k 253 -> 146, mixed 5k 4.4 -> 3.4, 20k 19.0 -> 15.0, 50k 43 -> 37.8, sparse 50k
14.1 -> 11.8. What is left is per site (~20 ms per GAE loop: its analysis, code generation and
the copies of its body) and per file version (``one`` at 50k: 6.8 s, most of it libcst's parse).
Round 2 (CPU s, 854624a -> after, run one after the other on the loaded machine): the builtin
rebinding scans walk only the top-level statements that spell the names asked about
(statement_memo.mentioning), a text pre-filter before the double-loop check, the loop map reads
block fields only, each live ``ast`` version is frozen out of the between-transform collections,
node kinds are cached per type: one 20k 2.56 -> 2.28 (paired runs: 2.00 -> 1.89), 50k 5.87 -> 5.39,
sparse 20k 4.02 -> 4.07 (paired: 3.83 -> 3.60), 50k 10.66 -> 10.28, mixed 20k 13.88 -> 13.68, 50k 39.4 -> 35.6, loops 20k
60.4 -> 53.9, 50k 146 (round 1; timed out at 600 s wall in the back-to-back run) -> 130; none 50k 1.45 -> 1.24. In ``one`` at 20k (1.9 s) libcst's parse of the whole file is
1.1 s, its two ``ast`` parses 0.2 s: what is left needs the libcst tree of only the statements a
transform edits. Round 3 (that: transforms/partial.py, ``FileContext.module_for``; libcst parses
the top-level statements holding a transform's candidates, fillers of the same lines stand for
the others and are written back as the file's text; output identical by ``--identity``; CPU s,
ef05687 -> after, paired runs on the loaded machine, peak MB in brackets): one 5k 0.54 -> 0.24,
20k 2.01 -> 0.80, 50k 5.18 -> 1.83 (458 -> 247); sparse 20k 3.83 -> 2.46, 50k 9.23 -> 6.35 (583 ->
310); mixed 5k 3.17 -> 2.78, 20k 13.02 -> 12.47, 50k 36.7 -> 33.5 (1004 -> 704); loops 5k 13.6 ->
13.2, 20k 52.3 -> 51.7; none unchanged (50k 1.20 -> 1.25). What bounds each now: ``none``, the ``ast``
parse and the transforms' ``ast`` scans; ``one`` at 50k (1.9 s), the two ``ast`` parses (0.6 s),
recurrence's pre-filter of every loop (0.6 s), hot.no_grad's scan (0.4 s); ``sparse`` at 50k, an
``ast`` parse per module version (1.8 of 7 s: six transforms edit), then per-site work; ``mixed``
and ``loops``, per-site work (each site's function is parsed once, which the whole parse cost
anyway): recurrence ~20 ms per GAE loop spread over its analyses, code generation and copies of
generated code (cProfile: no single cost above ~15%), reduction ~8 ms per site, and in ``loops``
a codegen of the one 5k-line function per version (1.8 s at 5k). ``scalebox rewrite`` of the
issue's file (22,500 lines, 2,500 loops in one function: ~80 CPU s) now prints a progress line
on stderr at least every ~8 s (steps, and a timer between them). Each (shape, size) runs
``Pipeline.rewrite`` in a fresh process, so peak RSS is that rewrite's. Wall and CPU seconds are
printed; the growth exponent is the slope of log(CPU time) against log(lines) between
consecutive sizes (1.0 is linear; CPU time, because on a shared machine wall time measures the
load).
Round 4 (files dense in sites, issue 19 item 13; CPU s, 627abd6 -> after, each pair run one after
the other on the loaded machine, load 4-6; peak MB unchanged): mixed 5k 2.98 -> 1.87, 20k 12.1 ->
8.6, 50k 35.0 -> 18.5 (705 -> 692 MB); loops 5k 14.8 -> 6.6, 20k 57.9 -> 27.8 (growth exponent
1.0); sparse 50k 7.2 -> 4.6; one 50k 2.7 -> 1.3; none 50k 2.2 -> 0.45. Output identical after
every step (``--identity eea1613 --identity-sizes 1000,5000``: 0 differ). Two costs grew faster than
the sites: grad_clip placed each site by counting the module's statements from the top
(``insert.cst_line``: the running widths are now kept per module), and libcst's
``isinstance(visitor, CSTVisitor)`` on a transformer class it has not seen walks every visitor
class alive -- classes made per call, never collected while gc is off for the rewrite (the five
per-call transformers are module-level classes now). The rest is per site and per version:
hot.no_grad and hot.target_graph_cut leave a file that builds no network (no class statement, no
``nn`` in its ASCII text) before any scan or import resolution; generated code is copied by a
copier per node type and shaped by CPython 3.11's C tokenizer (~9x the tokenize module); libcst
and ast walks read fields through a reader per node type (cstwalk, astwalk), the last walks of
loop bodies are kept (a body was walked ~5x per site), node kinds asked about per node are cached
per type (``isinstance`` through ``ABCMeta`` otherwise), structure keys are kept per node, the
function facts walk each loop and each function once; read_elsewhere, early_exit_reason and the
reducing-call finders skip their libcst visits where a field walk finds nothing they count; the
pipeline's splice takes a parsed statement's code as its chunk's text (``Partial.sources``,
libcst's round trip) instead of generating the old statement again (a quarter of the codegen).
The 10 s goal for ``mixed`` at 50k is not reached (18.5 s): what the pipeline does per module
version alone is ~9.6 s there (ast.parse of the whole file after each of the five transforms
that edit, 4.1; codegen of the rewritten functions, 2.3; libcst parses of the functions
transforms edit, 2.3; line maps and collections, 1.0); then per site recurrence ~9 ms per GAE
loop (its plan, analysis, three parses of generated text from cached shapes and their copies,
~1 ms each), reduction and elementwise ~3.5 ms, target_update ~2 ms, grad_clip's whole-module
scan 1.2 s. ``loops`` at 20k (27.8 s): recurrence ~8 ms per loop, the codegen of the one
function after it (~2 s per 5k input lines, the function grows ~6x) and the ast parse of it.
Round 5 (issue 19 item 13; CPU s, 1d52881 -> after, each pair old then new in fresh processes
on the loaded machine, peak MB in brackets): mixed 20k 8.17 -> 4.92 (302 -> 182), 50k 18.4 -> 13.2
(692 -> 414; bench table after: 13.45, exponent 1.02), loops 5k 7.07 -> 5.58, 20k 28.6 -> 23.2
(bench table after: 22.9, exponent 1.07; peak unchanged). Output identical after every step
(``--identity 1d52881 --identity-sizes 1000,5000``: 0 differ). What changed: where the codegen
spliced a version, its ``ast`` is the last version's kept statements with their lines shifted
and parses of the generated stretches (scalebox_cst/astsplice.py; ``ast.parse`` of the whole
file after each of the five editing transforms was ~4 s at mixed 50k, now ~2 s, and the versions
share their unchanged nodes: the peak drop); the pipeline's codegen and recurrence's ``_code``
write nodes through scalebox_cst/fastcode.py (one emitter per node type copied from libcst 1.9's
``_codegen_impl``, without its per-node hooks and generator context managers: 3-4x); the builtin
checks walk only statements that can bind the name (statement_memo.may_bind: ``range(n)`` binds
nothing), with one checker per module version and the statements picked for a word kept for the
version; the one-line statements and expressions every vectorize transform generates per site are
copied from the parse of their shape (cstclone.parse_statement/parse_expression); recurrence
finds a site's names in rendered text without compiling a regex per name (syntax.spells);
grad_clip's scan walks only the statements spelling a word a recognised call must spell; the
imports scan dispatches on node type. What is left at mixed 50k (~13 s): libcst's parse of the
functions transforms edit (~2.3 s, a quarter of it libcst's node validation), the spliced ``ast``
(~2 s, most of it moving kept statements' lines in Python), codegen and line maps (~1.5 s), then
per site: recurrence ~6 ms per GAE loop (plan, analysis, shapes of generated text and their
copies, the fused program's compile), reduction and elementwise ~2.5 ms, the others ~2 ms.
Round 6 (issue 19 item 13; CPU s of the whole process, 17d5522 -> after, farm-bench -n 3, pairs
run in turn): a rewritten recurrence loop is written as rows of text (scalebox_cst/emitted.py)
instead of a libcst tree made by parsing its generated text and copying its body for each place
(the pipeline then wrote the tree back as text); a later transform that reads such a statement
gets the parse of its code (``emitted.realized``). mixed 50k 17.3 -> 14.6 (0.84x), loops 20k
22.9 -> 16.4 (0.70x; in-process 25.5 -> 15.7), loops 50k 61.5 -> 40.2 (peak 2.8 -> 2.3 GB); real
scripts unchanged (30 CleanRL/LeanRL files: 0.96-1.01x). Output identical (``--identity 17d5522
--identity-extra`` 1,324 public files: 0 of 1,395 differ). The table after it, on a quieter
minute (CPU s, in-process): none 50k 0.46, one 50k 1.02, sparse 50k 3.28, mixed 20k 4.47, 50k
11.29, loops 20k 14.3, 50k 38.4 (exponents 0.84-1.08). What bounds ``loops`` now: libcst's parse
of the one 50k-line function (~7 s alone), the ``ast`` of its ~300k-line rewrite, then ~3 ms of
analysis and planning per loop; ``mixed``: libcst's parse of the 2,525 edited functions (~2.7 s),
the spliced ``ast`` of five versions (~2.4 s, most of it moving kept statements' lines), then
2-6 ms per site.
Round 7 (issue 19 item 13; 8134796 -> after): libcst parses without re-validating the nodes its
parser built (transforms/analysis/cstparse.py: a fifth of a parse); a version's generated
stretches are parsed in one ``ast.parse`` at their lines, and kept statements move through their
lined nodes gathered once per file (astsplice.Memo); line maps are the diff's stretches, and a
splice's map diffs only the made text (linediff.LineMap, spliced_line_map: 0.55 -> 0.10 s at mixed
50k); fastcode writes each statement of a rewritten loop once for its five depths; recurrence
works out a fused program's normal text and parameters once per shape of program
(recurrence/program_shapes.py: a parse, an unparse and a compile per loop were ~0.5 ms); and the
analyses' caches of the file's trees are emptied as the rewrite ends (transforms/rewrite_caches.py):
they held ~650k objects, which interpreter exit took ~4 s to tear down. Whole process (farm-bench
-n 3, pairs in turn): mixed 50k 17.9 -> 15.5 (0.87x, before the cache fix), loops 20k 20.8 -> 15.7
(0.76x); ``scalebox rewrite`` of mixed 50k 15.5 -> 12.3-12.9 s wall. The table after it (CPU s,
in-process, quiet minute): none 50k 0.47, one 50k 1.05, sparse 50k 2.89, mixed 20k 4.20, 50k
10.70, loops 5k 2.81, 20k 11.46, 50k 30.2 (peak 2.3 GB; exponents <= 1.06). Output identical (``--identity 8134796
--identity-extra`` 1,324 public files: 0 of 1,395 differ). What bounds the dense shapes is now
the design, not a hot spot: each site's function is a libcst tree (its parse: 1.8 s at mixed 50k,
~6 s for the one 50k-line function of ``loops``), each rewritten loop is ~6x its lines (their
``ast``: ~1 s at mixed 50k, ~4 s at loops 50k), and each site's analysis is 2-5 ms spread over
dozens of checks (no function above ~8% of a profile).
Round 8 (what bounds ``loops`` 50k, measured): libcst's parse of its one 50k-line function alone
is 7.8 CPU s here (gc off, best of 2; ``ast.parse`` of it: 0.5 s), and in the profile that parse
runs in libcst's native code (its Python-side node hooks are ~7% of it). Any design that gives the
function to libcst stays above 10 s for this shape; under it needs recurrence's analysis on
``ast``, emitting text (libcst only for statements it edits: here, all 5,555 loops). Real files
(not this benchmark): the hot.* rewriters parse, visit and position only the statements holding
their calls (transforms/hot/bindings.visit_calls): per-file rewrite CPU time (in-process, best of
3 over 3 interleaved rounds) tianshou 0.33-0.42x, torchrl 0.64x, LeanRL 0.72-0.75x, CleanRL
0.74-0.99x, minimalRL 0.89-1.07x (noise), 21 files 9.47 -> 7.27 s.
Round 9 (sixteenth session; CPU s of ``Pipeline.rewrite`` in a process of its own per side, 6532695 ->
after, on a quieter 2-core machine): a ``def``/``class`` of 600+ lines is parsed by libcst in pieces
of ~150 lines of its body (transforms/analysis/cstpieces.py: libcst costs more per line the
longer its input, 0.52 ms per 9-line loop in 150-line pieces against 1.06 in one 20k-line
function), and three per-site walks of the whole function became one walk per function
(``read_elsewhere``'s reads, analysis/read_index.py; ``declares_global``; hot.no_grad's stores and
the hot flow's block scans): loops 22.5k (the issue's file: 2,500 loops) 9.64 -> 8.02, loops 50k
22.5 -> 18.7, mixed 50k 7.83 -> 7.77, block 1k 26.1 -> 3.0, block 2k 103.8 -> 6.3 (the table
after it: block 2k 6.0, 5k 16.7, 10k 36.0, exponent 1.12); 20 public files (CORL, spinningup,
rlkit, SB3, Rainbow, with ``bench_rewrite_files.py``) 1.01x. What bounds ``loops`` 50k is still
round 8's: libcst's parse of the loops (now ~3.5 s), the ``ast`` of the ~6x output and ~1.5 ms of
analysis per loop; ``block`` is ~6 ms per block of eight sites.
Round 10 (seventeenth session; CPU s, 4285474 -> after, each side in a process of its own,
interleaved on the 2-core machine under a helper's load): mixed 50k 8.72/8.77/8.68 -> 8.97/8.88/
8.48 (the new check for TorchScript/marimo bodies first walked the whole tree after every editing
transform, its text pre-filter matching ``runtime.vectorized``: 10.7 s until mended), loops 50k
19.6/19.4 -> 19.2/19.7 (the walk of each loop that list outputs no longer need is still made for
``fold.dead_after``); loops 22.5k (the issue's file) 8.9, mixed 22.5k 4.5.
Round 11 (issue 19 item 13; CPU s of ``Pipeline.rewrite``, each side in a process of its own, pairs
in turn on the 2-core machine under another user's load, medians of 3; 21461d5 -> after): loops
22.5k 6.61 -> 5.46, loops 50k 14.94 -> 12.44 (0.83x both); recurrence's own work per loop (its
analysis, plan and checks, without libcst's parse of the loops and the one walk of the function)
~1.14 -> ~0.72 ms. What changed: the checks of one loop that look for one or two kinds of node
(subscripts, calls, assignments, bindings, conditional expressions) read one walk of the body by
node type (cstwalk.typed, kept per node) instead of a walk each with an ``isinstance`` through
``ABCMeta`` per node; that walk and function_facts' walks skip layout nodes (cstwalk.walk_code:
whitespace, comments, brackets, commas, ~45% of the nodes); function_facts counts a loop from its
body's typed walk; names_read keeps its answers per node and does not enter layout; the structure
key of a name is its value (82% of the keys; each was a libcst codegen with hooks); names.dotted,
the grammar's check and the statement dispatch test exact types. Output identical
(``--identity b1c584d --identity-sizes 1000,5000``: 0 differ). What is left at loops 50k (12.3 s,
in-process): the ``ast`` of the rewritten function's stretches (astsplice, 2.5 s: each loop becomes
~55 lines), libcst's parse of the loops (2.4 s), recurrence's per-loop work (~3.9 s: plan 0.87,
analysis 0.81, one-pass program 0.55, the candidate test with the body's first walk 0.50, no
function above ~5%), the one walk of the function (function_facts, 0.5 s), the codegen (0.56 s)
and the rest of the pipeline (~2.4 s: the first ``ast`` parse, the other transforms' scans).
Round 12 (twenty-sixth session; ``bench_rewrite_files.py --old REV --rounds 2 --repeat 1``, paired
in fresh processes, on a machine ~1.4x slower than round 11's: a1dc491 took 17.2 s for loops 50k
here against 12.2 there): where two or more ways of a rewritten loop end with steps to run as
written, one loop after them runs those (recurrence.build._layout), so the body is written 3
times, not 5 (774 -> 600 ``ast`` nodes per GAE loop): loops 20k 7.32 -> 6.74 (0.92x), loops 50k
17.19 -> 16.29 (0.95x), mixed 50k 7.74 -> 7.63; peak at loops 50k 2313 -> 1936 MB. Output changes
on purpose (4 goldens). What is left at loops 50k (16.8 s here): recurrence's own work 9.9 s (of
which libcst's parse of the function, 332 chunks of ~5.3k characters, 3.3 s), the ``ast`` of the
generated code 3.3 s, codegen 0.7 s, the other transforms under 0.6 s.
Target (issue 9, item 13): linear, a 50k-line file under 10 s and 1 GB. Measured on the loaded
2-core machine (CPU s / peak MB, 50k lines; old = before the statement memo, spliced codegen,
grad_clip's path-only insertion pass and recurrence's kept-loop pre-filter, run back to back):
one 11.3/507 -> 9.7/512 (7.1 in a quieter minute), sparse 24.6/576 -> 18.1/585 (13.7 quieter),
mixed 65.9/1162 -> 55.7/1043; mixed 20k 22.9 -> 18.1. What is left at 50k: one whole-file
libcst parse (~5 s, the bulk of ``one``), an ``ast.parse`` per module version (~0.7 s each), the
first version's whole-module scans, and the transforms' own per-site work (``mixed``).

    python benchmarks/bench_scaling.py [--sizes 1000,2000,5000,10000,20000,50000] [--shapes none,one,sparse,mixed]

Speed-ups must not change what is written: ``--identity OLD`` (a git ref, or a directory holding
``scalebox_cst/``, ``transforms/`` and ``runtime/``) rewrites tests/corpus/*.py, examples/**/*.py
and generated files of each shape (``--identity-sizes``) with the old code and with this tree's,
each in its own process, and reports every file whose output bytes (or site list) differ.

    python benchmarks/bench_scaling.py --identity HEAD~3 [--identity-extra DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import glob
import hashlib
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(HERE) not in sys.path:
    sys.path.insert(0, os.path.dirname(HERE))

HEADER = '''"""Generated for bench_scaling."""
import torch


'''

PLAIN = '''def helper_{i}(xs, scale={i}):
    """Plain code: no candidate for any transform."""
    total = 0
    for x in xs:
        if x > scale:
            total = total + x * 2
        else:
            total = total - 1
    return total


'''

SITES = (
    # vectorize.target_update
    '''def soft_update_{i}(critic, critic_target, tau):
    for param, target_param in zip(critic.parameters(), critic_target.parameters()):
        target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)
    return critic_target


''',
    # vectorize.recurrence (CleanRL GAE)
    '''def gae_{i}(rewards, values, dones, next_value, next_done, gamma, gae_lambda, num_steps):
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages


''',
    # vectorize.reduction
    '''def finish_episode_{i}(saved_log_probs, returns):
    policy_loss = []
    for log_prob, R in zip(saved_log_probs, returns):
        policy_loss.append(-log_prob * R)
    policy_loss = torch.cat(policy_loss).sum()
    return policy_loss


''',
    # grad_clip
    '''def train_step_{i}(model, batch):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(batch).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


''',
    # vectorize.elementwise
    '''def scale_{i}(rewards, values, out, gamma):
    for i in range(len(rewards)):
        out[i] = rewards[i] + gamma * values[i]
    return out


''',
)

#: the ``loops`` shape: one function holding nothing but GAE-style backward loops (9 lines each)
LOOP = '''    adv_{i} = torch.zeros_like(rewards)
    last = 0
    for t in reversed(range(T)):
        if t == T - 1:
            nv = next_value
        else:
            nv = values[t + 1]
        delta = rewards[t] + gamma * nv * masks[t] - values[t]
        adv_{i}[t] = last = delta + gamma * lam * masks[t] * last
'''

#: the ``block`` shape: one training function of 16-line blocks, each holding sites of eight
#: transforms (fresh tensors, a tensor of a list, an acting forward, a target network's forward,
#: distributions, an optimizer step, a reduction and an elementwise loop) and reusing its names
#: (``k``, ``rewards``) as real training functions do
BLOCK_HEAD = """import torch
import torch.nn as nn
from torch.distributions import Normal
class Q(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 2)
    def forward(self, x):
        return self.l(x)
def train(env, xs, device, batch, rewards, values, out):
    q = Q()
    q_target = Q()
    q_target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
"""
BLOCK = """    s{i} = torch.FloatTensor(xs).to(device)
    obs{i} = torch.tensor([b[0] for b in batch], dtype=torch.float32)
    a{i} = q(s{i}).argmax().item()
    env.step(a{i})
    nq{i} = q_target(s{i}).max(1)[0]
    d{i} = Normal(q(s{i}), torch.exp(q(s{i})))
    loss{i} = (q(s{i}).sum() - nq{i}.sum()) ** 2 + d{i}.log_prob(s{i}[:, :2]).sum()
    opt.zero_grad()
    loss{i}.backward()
    opt.step()
    acc{i} = 0
    for k in range(len(rewards)):
        acc{i} += rewards[k] * values[k]
    for k in range(len(rewards)):
        out[k] = rewards[k] + 0.99 * values[k]
"""

SHAPES = ("none", "one", "sparse", "mixed", "loops", "block")
#: blocks per site in the ``sparse`` shape (about one site per 200 lines, like a training script)
SPARSE_EVERY = 20


def make_source(lines: int, shape: str) -> str:
    """A file of about ``lines`` lines (never fewer) of the given shape."""
    parts = [HEADER]
    count = HEADER.count("\n")
    i = 0
    if shape == "loops":
        return _one_function(lines, "def analyse(rewards, values, masks, next_value, gamma, lam, T):\n", LOOP, "    return last\n", 2)
    if shape == "block":
        return _one_function(lines, BLOCK_HEAD, BLOCK, "    return out\n", 1)
    if shape == "one":
        parts.append(SITES[1].format(i=i))
        count += SITES[1].count("\n")
        i += 1
    while count < lines:
        if shape == "mixed" and i % 2 == 1:
            block = SITES[(i // 2) % len(SITES)].format(i=i)
        elif shape == "sparse" and i % SPARSE_EVERY == 1:
            block = SITES[(i // SPARSE_EVERY) % len(SITES)].format(i=i)
        else:
            block = PLAIN.format(i=i)
        parts.append(block)
        count += block.count("\n")
        i += 1
    return "".join(parts)


def _one_function(lines: int, head: str, block: str, tail: str, reserve: int) -> str:
    """HEADER, then ``head`` and copies of ``block`` (``{i}``: its number) while fewer than
    ``lines - reserve`` lines are written, then ``tail``: one function holding every site."""
    parts = [HEADER, head]
    count = HEADER.count("\n") + head.count("\n")
    i = 0
    while count + reserve < lines:
        parts.append(block.format(i=i))
        count += block.count("\n")
        i += 1
    parts.append(tail)
    return "".join(parts)


def measure_here(lines: int, shape: str, backend: str = "cpu") -> dict:
    """Rewrite one generated file in this process: seconds, peak RSS (MB), sites."""
    import resource
    import time

    from scalebox_cst.config import Config
    from scalebox_cst.pipeline import Pipeline

    data = make_source(lines, shape).encode()
    pipeline = Pipeline(Config(), backend)
    t0, c0 = time.perf_counter(), time.process_time()
    result = pipeline.rewrite("gen.py", data)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "lines": data.count(b"\n"),
        "shape": shape,
        "seconds": seconds,
        "cpu": cpu,
        "peak_mb": peak_kb / 1024.0,
        "rewritten": sum(1 for s in result.report.sites if s.action == "rewritten"),
        "sites": len(result.report.sites),
        "error": result.report.error,
    }


def measure(lines: int, shape: str, backend: str, timeout: float) -> dict:
    code = (
        "import json, sys; sys.path.insert(0, %r); import bench_scaling as b; "
        "print(json.dumps(b.measure_here(%d, %r, %r)))" % (HERE, lines, shape, backend)
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"lines": lines, "shape": shape, "seconds": math.inf, "cpu": math.inf, "peak_mb": math.nan, "rewritten": 0, "sites": 0, "error": f"timed out after {timeout:.0f}s"}
    if proc.returncode != 0:
        raise SystemExit(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def identity_inputs(root: str, sizes, extra=()) -> dict:
    """name -> source bytes: the corpus, the examples, generated files of every shape and the
    ``.py`` files under each folder of ``extra`` (public code fetched for the check)."""
    files = {}
    for folder in extra:
        for path in sorted(glob.glob(os.path.join(folder, "**", "*.py"), recursive=True)):
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    files[os.path.join("extra", os.path.relpath(path, folder))] = f.read()
    for pattern in ("tests/corpus/*.py", "examples/**/*.py"):
        for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
            with open(path, "rb") as f:
                files[os.path.relpath(path, root)] = f.read()
    for shape in SHAPES:
        for size in sizes:
            files[f"gen_{shape}_{size}.py"] = make_source(size, shape).encode()
    return files


def rewrite_digests(inputs_json: str) -> dict:
    """name -> sha256 of the output, and the sites and error as text (run under the code tested)."""
    from scalebox_cst.config import Config
    from scalebox_cst.pipeline import Pipeline

    with open(inputs_json) as f:
        inputs = json.load(f)
    pipeline = Pipeline(Config(), "cpu")
    out = {}
    for name, text in inputs.items():
        result = pipeline.rewrite(name, text.encode("latin-1"))
        sites = [(s.transform, s.line, s.end_line, s.action, s.reason) for s in result.report.sites]
        out[name] = {
            "output": hashlib.sha256(result.output).hexdigest(),
            "changed": result.output != result.source,
            "sites": hashlib.sha256(repr(sites).encode()).hexdigest(),
            "error": result.report.error,
        }
    return out


def _code_tree(old: str, work: str) -> str:
    """A directory where ``import scalebox_cst`` (with .transforms and .runtime) is the old code."""
    root = os.path.join(work, "old")
    pkg = os.path.join(root, "scalebox_cst")
    if os.path.isdir(old):
        src = old
    else:
        src = os.path.join(work, "archive")
        os.makedirs(src)
        repo = os.path.dirname(HERE)
        archive = subprocess.run(["git", "-C", repo, "archive", old, "scalebox_cst", "transforms", "runtime"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    shutil.copytree(os.path.join(src, "scalebox_cst"), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for sub in ("transforms", "runtime"):
        target = os.path.join(pkg, sub)
        if os.path.isdir(os.path.join(src, sub)):
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(os.path.join(src, sub), target, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _digests_under(code_root: str, inputs_json: str) -> dict:
    snippet = (
        # scalebox_cst first: importing bench_scaling puts this checkout on sys.path
        "import json, sys; sys.path.insert(0, %r); sys.path.insert(1, %r); import scalebox_cst; "
        "assert scalebox_cst.__file__.startswith(%r), scalebox_cst.__file__; import bench_scaling as b; "
        "print(json.dumps(b.rewrite_digests(%r)))" % (code_root, HERE, os.path.join(code_root, ""), inputs_json)
    )
    proc = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"rewrite under {code_root} failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def identity(old: str, sizes, extra=()) -> int:
    """Rewrite the same inputs with ``old`` and this tree's code; print the files that differ."""
    repo = os.path.dirname(HERE)
    with tempfile.TemporaryDirectory(prefix="scalebox-identity-") as work:
        inputs = identity_inputs(repo, sizes, extra)
        inputs_json = os.path.join(work, "inputs.json")
        with open(inputs_json, "w") as f:
            json.dump({k: v.decode("latin-1") for k, v in inputs.items()}, f)
        before = _digests_under(_code_tree(old, work), inputs_json)
        after = _digests_under(repo, inputs_json)
    differ = [name for name in inputs if before[name] != after[name]]
    changed = sum(1 for name in inputs if after[name]["changed"])
    for name in differ:
        b, a = before[name], after[name]
        what = [k for k in ("output", "sites", "error") if b[k] != a[k]]
        print(f"DIFFERS {name}: {', '.join(what)}" + (f" (error before {b['error']!r}, after {a['error']!r})" if "error" in what else ""))
    print(f"identity against {old}: {len(inputs)} files ({changed} rewritten), {len(differ)} differ")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2000,5000,10000,20000,50000")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per rewrite before giving up")
    ap.add_argument("--identity", metavar="OLD", help="compare outputs with OLD (git ref or code directory) instead of timing")
    ap.add_argument("--identity-sizes", default="300,1000,3000", help="sizes of the generated files --identity rewrites")
    ap.add_argument("--identity-extra", metavar="DIR", action="append", default=[],
                    help="also compare the .py files under DIR (repeatable: public code fetched for the check)")
    args = ap.parse_args()
    if args.identity:
        return identity(args.identity, [int(s) for s in args.identity_sizes.split(",")], args.identity_extra)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'shape':6} {'lines':>7} {'seconds':>9} {'cpu s':>8} {'lines/s':>8} {'peak MB':>8} {'sites':>6} {'rewritten':>9} {'exponent':>8}")
    worst = 0.0
    for shape in args.shapes.split(","):
        prev = None
        for size in sizes:
            row = measure(size, shape, args.backend, args.timeout)
            exponent = ""
            # the exponent is taken on CPU seconds: on a shared machine wall time measures the load
            if prev is not None and math.isfinite(row["cpu"]) and prev["cpu"] > 0:
                e = math.log(row["cpu"] / prev["cpu"]) / math.log(row["lines"] / prev["lines"])
                exponent = f"{e:.2f}"
                if prev["cpu"] > 0.2:  # below that, start-up noise dominates the ratio
                    worst = max(worst, e)
            print(
                f"{shape:6} {row['lines']:7d} {row['seconds']:9.2f} {row['cpu']:8.2f} {row['lines'] / row['cpu'] if row['cpu'] else 0:8.0f} "
                f"{row['peak_mb']:8.0f} {row['sites']:6d} "
                f"{row['rewritten']:9d} {exponent:>8}" + (f"  error: {row['error']}" if row["error"] else ""),
                flush=True,
            )
            prev = row
            if not math.isfinite(row["seconds"]):
                break
    print(f"largest growth exponent between sizes (where the smaller took > 0.2 s): {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
