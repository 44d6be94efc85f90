#!/usr/bin/env python3
"""Build measurements.csv and gpu_specs.csv from published GPU kernel/layer timings.

Sources (read-only git mirrors, obtained with the `fetch` tool):
  * NeuSight   https://github.com/sitar-lab/NeuSight        (MIT)
  * DeepBench  https://github.com/baidu-research/DeepBench  (Apache-2.0)

Only numbers (facts) are carried over; no source code is copied.

Usage:
    python build_reference.py [--neusight DIR] [--deepbench DIR] [--out DIR]

DIR arguments are bare git directories (`git -C DIR show HEAD:path` must work).
Requires pandas, numpy, openpyxl.
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import math
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from gpu_specs import GPU_SPECS

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent.parent / "tbs" / "predictions" / "reference"
DEFAULT_NEUSIGHT = "/work/.mirror/sitar-lab+NeuSight/repo"
DEFAULT_DEEPBENCH = "/work/.mirror/baidu-research+DeepBench/repo"

COLUMNS = [
    "source", "source_path", "license", "device", "framework", "precision", "op", "phase",
    "batch", "m", "n", "k", "in_h", "in_w", "in_c", "out_c", "kernel_h", "kernel_w",
    "stride", "padding", "hidden", "input_size", "seq_len", "flops", "bytes",
    "measured_seconds", "notes", "calls_before",
]
CAP = 400  # max rows per (source, device, op, phase, precision) for gemm/conv2d/recurrent ops
CAP_MEMORY_BOUND = 150  # layernorm/softmax/elementwise/embedding/copy (keeps the file near 3 MB)

# --------------------------------------------------------------------------------------
# git helpers
# --------------------------------------------------------------------------------------

def git_show(repo: str, path: str) -> bytes | None:
    r = subprocess.run(["git", "-C", repo, "show", f"HEAD:{path}"], capture_output=True)
    return r.stdout if r.returncode == 0 else None


def git_ls(repo: str) -> list[str]:
    out = subprocess.check_output(["git", "-C", repo, "ls-tree", "-r", "HEAD", "--name-only"])
    return out.decode().splitlines()


def git_head(repo: str) -> str:
    return subprocess.check_output(["git", "-C", repo, "rev-parse", "HEAD"]).decode().strip()


def read_csv(repo: str, path: str) -> pd.DataFrame | None:
    b = git_show(repo, path)
    if b is None:
        print(f"  [skip] not readable (absent from snapshot, >=4 MiB or LFS): {path}", file=sys.stderr)
        return None
    return pd.read_csv(io.BytesIO(b))


def prod(xs):
    p = 1
    for x in xs:
        p *= int(x)
    return p


def blank_row(**kw):
    r = {c: "" for c in COLUMNS}
    r.update(kw)
    return r

# --------------------------------------------------------------------------------------
# NeuSight
# --------------------------------------------------------------------------------------
NS_LICENSE = "MIT"
NS_FRAMEWORK = "pytorch-2.1.0+cu121"  # from 'Torch Version','CUDA Version','CUDNN Version' columns
NS_DEVICE = {
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA A100-PCIE-40GB": "a100-40gb-pcie",
    "NVIDIA A100 80GB PCIe": "a100-80gb-pcie",
    "NVIDIA L4": "l4",
    "Tesla T4": "t4",
    "Tesla P100-PCIE-16GB": "p100-pcie",
    "Tesla P4": "p4",
    "Tesla V100-PCIE-32GB": "v100-pcie",
}
NS_LABEL_DIR_DEVICE = {k.replace(" ", "_").replace("-", "-"): v for k, v in NS_DEVICE.items()}
NS_LABEL_DIR_DEVICE.update({
    "NVIDIA_H100_80GB_HBM3": "h100", "NVIDIA_A100-PCIE-40GB": "a100-40gb-pcie",
    "NVIDIA_A100_80GB_PCIe": "a100-80gb-pcie", "NVIDIA_L4": "l4", "Tesla_T4": "t4",
    "Tesla_P100-PCIE-16GB": "p100-pcie", "Tesla_P4": "p4", "Tesla_V100-PCIE-32GB": "v100-pcie",
})
NS_BINARY = {"add", "mul", "pow", "div"}
NS_UNARY = {"addu": "add(t,s)", "mulu": "mul(t,s)",
            "powu": "pow(t,s)", "divu": "div(t,s)",
            "relu": "relu", "gelu": "gelu", "tanh": "tanh"}
BPE = {"fp32": 4, "tf32": 4, "fp16": 2, "mixed": 2}


def short_kernel(name) -> str:
    s = str(name)
    s = re.sub(r"\(.*", "", s)  # drop argument list
    s = s.replace("void ", "")
    return s[:40]


def ns_micro_rows(repo: str, files: list[str]) -> list[dict]:
    rows = []
    collect_re = re.compile(r"scripts/asplos/data/dataset/train/collect/([a-z]+)/p2\.1\.0/(.+)\.csv$")
    sources = []
    for f in files:
        m = collect_re.match(f)
        if m and m.group(2) in NS_DEVICE:
            sources.append((f, m.group(1), "train"))
    for op in ["linear", "bmm", "ln", "softmax", "elem"]:
        sources.append((f"scripts/asplos/data/dataset/test/{op}.csv", op, "test"))

    for path, opname, split in sources:
        df = read_csv(repo, path)
        if df is None:
            continue
        for position, (_, r) in enumerate(df.iterrows()):
            dev = NS_DEVICE.get(str(r["Device"]).strip())
            if dev is None:
                continue
            lat_s = float(r["Latency"]) * 1e-3  # NeuSight 'Latency' is CUDA-event elapsed_time -> milliseconds
            op = str(r["OPName"])
            base = dict(source="neusight", source_path=path, license=NS_LICENSE, device=dev,
                        framework=NS_FRAMEWORK, precision="fp32", phase="forward",
                        measured_seconds=lat_s)
            kern = short_kernel(r.get("Kernel Name", ""))
            if op == "linear":
                B, M, N, K = (int(r[c]) for c in ("B", "M", "N", "K"))
                m, k, n = B * M, N, K
                rows.append(blank_row(**base, op="gemm", batch=1, m=m, n=n, k=k,
                                      flops=2 * m * n * k, bytes=4 * (m * k + k * n + n + m * n),
                                      notes=f"linear x=({B},{M},{N}) bias; {kern}",
                                      _sub="micro:linear"))
            elif op == "bmm":
                B, M, N, K = (int(r[c]) for c in ("B", "M", "N", "K"))
                rows.append(blank_row(**base, op="gemm", batch=B, m=M, n=K, k=N,
                                      flops=2 * B * M * N * K, bytes=4 * B * (M * N + N * K + M * K),
                                      notes=f"bmm; {kern}",
                                      _sub="micro:bmm"))
            elif op == "conv":
                B = int(r["B"]); ci = int(r["Input_Channel"]); co = int(r["Output_Channel"])
                ks = int(r["Kernel_Szie"]); ins = int(r["Input_Size"]); s = int(r["Stride"]); p = int(r["Padding"])
                out = (ins + 2 * p - ks) // s + 1
                if out <= 0:
                    continue
                rows.append(blank_row(**base, op="conv2d", batch=B, in_h=ins, in_w=ins, in_c=ci, out_c=co,
                                      kernel_h=ks, kernel_w=ks, stride=s, padding=p,
                                      flops=2 * B * out * out * co * ks * ks * ci,
                                      bytes=4 * (B * ci * ins * ins + co * ci * ks * ks + B * co * out * out),
                                      notes=f"conv out={out}x{out}; {kern}",
                                      # the shapes its process had timed before it (the file's rows are in the order
                                      # they were run, shapes in random order): cuDNN's per-call cost grows with it
                                      calls_before=position,
                                      _sub="micro:conv"))
            elif op in ("ln", "softmax"):
                B, H = int(r["B"]), int(r["H"])
                nbytes = 4 * (2 * B * H + 2 * H) if op == "ln" else 4 * 2 * B * H
                rows.append(blank_row(**base, op="layernorm" if op == "ln" else "softmax", batch=B, hidden=H,
                                      flops=B * H, bytes=nbytes,
                                      notes=f"{op}",
                                      _sub=f"micro:{op}"))
            elif op in NS_BINARY or op in NS_UNARY:
                B, H = int(r["B"]), int(r["H"])
                nel = B * H
                if op in NS_BINARY:
                    nbytes, desc = 4 * 3 * nel, f"{op}(t,t)"
                else:
                    nbytes, desc = 4 * 2 * nel, NS_UNARY[op]
                rows.append(blank_row(**base, op="elementwise", batch=B, hidden=H, flops=nel, bytes=nbytes,
                                      notes=desc,
                                      _sub=f"micro:{op}"))
    return rows


def _lit(s):
    try:
        return ast.literal_eval(str(s))
    except Exception:
        return None


def _shape_list(x):
    """input_shapes -> list of shapes (list of ints)."""
    v = _lit(x)
    if not isinstance(v, (list, tuple)):
        return []
    out = []
    for s in v:
        if isinstance(s, (list, tuple)) and all(isinstance(i, int) for i in s):
            out.append(list(s))
    return out


ELEMENTWISE_FUNCS = {
    "<built-in function add>": "add", "<built-in function mul>": "mul", "<built-in function sub>": "sub",
    "<built-in function truediv>": "div", "<built-in function pow>": "pow",
    "<built-in method pow of type object>": "pow", "<built-in method tanh of type object>": "tanh",
    "<built-in function gelu>": "gelu", "<function dropout>": "dropout",
    "<built-in method where of type object>": "where", "<built-in method rsqrt of type object>": "rsqrt",
    "<built-in method max of type object>": "max", "<built-in method min of type object>": "min",
    "<built-in function neg>": "neg", "<built-in method abs of type object>": "abs",
    "<built-in method log of type object>": "log",
}
ELEMENTWISE_METHODS = {"pow": "pow", "masked_fill": "masked_fill", "masked_fill_": "masked_fill"}
MODULE_OPS = {
    "torch.nn.modules.linear.Linear": "gemm", "torch.nn.modules.sparse.Embedding": "embedding",
    "torch.nn.modules.normalization.LayerNorm": "layernorm", "torch.nn.modules.activation.Softmax": "softmax",
    "torch.nn.modules.dropout.Dropout": "elementwise:dropout", "torch.nn.modules.activation.ReLU": "elementwise:relu",
    "torch.nn.modules.activation.Tanh": "elementwise:tanh", "torch.nn.modules.activation.GELU": "elementwise:gelu",
}


# An embedding's backward (PyTorch 2.1, embedding_dense_backward_cuda) writes a dense gradient of the whole table:
# at::zeros(rows x hidden), then accumulates the output gradient's rows into it. Up to 3072 indices, one kernel walks
# every index (skipping padding_idx); above, the indices are radix-sorted (int64 keys with their positions), and
# each run of equal indices is summed in partial sums of 10 rows, which are read back and scattered.
EMBEDDING_SORT_ABOVE = 3072
EMBEDDING_ROWS_PER_PARTIAL = 10
# The table behind each model-trace embedding node, from NeuSight's model configs
# (scripts/asplos/data/DLmodel_configs/<model>.json): (node name suffix, config key of its rows, role). An
# nn.Embedding module's weight is not among the node's inputs (an F.embedding call's is, and its shape is used).
NS_EMBEDDING_TABLES = (("word_embeddings", "vocab_size", "token"), ("wte", "vocab_size", "token"),
                       ("embed_tokens", "vocab_size", "token"), ("token_type_embeddings", "type_vocab_size", "token"),
                       ("position_embeddings", "max_position_embeddings", "position"), ("wpe", "n_positions", "position"))
NS_INPUT_ID = 1  # NeuSight traces models on input_ids = torch.ones(batch, seq)
NS_MODEL_CONFIGS = "scripts/asplos/data/DLmodel_configs/{model}.json"


def ns_model_config(repo: str, model: str, cache: dict) -> dict:
    if model not in cache:
        raw = git_show(repo, NS_MODEL_CONFIGS.format(model=model))
        cache[model] = json.loads(raw) if raw is not None else {}
    return cache[model]


def ns_embedding_table(config: dict, node: str, args: str, ins: list, seq: int) -> tuple[int, int, bool] | None:
    """(table rows, distinct indices, every index is padding_idx) of a NeuSight model-trace embedding node.

    NeuSight's input ids are torch.ones (every token id 1) and BERT's token types are zeros: a token table sees one
    distinct index; a position table (HF's arange positions, OPT's learned positions) one per sequence position.
    HF's BERT and OPT token embeddings take the config's pad_token_id as padding_idx (BERT 0, OPT 1): OPT's ids of 1
    are all padding, whose gradient rows the kernel skips. None where the table is unknown.
    """
    role, rows = None, None
    if len(ins) >= 2 and len(ins[1]) == 2:  # F.embedding(indices, weight): OPT's learned positions (rows = 2048 + 2)
        rows, role = ins[1][0], "position" if "position" in args else "token"
    else:
        for suffix, key, kind in NS_EMBEDDING_TABLES:
            if node.endswith(suffix) and key in config:
                rows, role = int(config[key]), kind
                break
    if rows is None:
        return None
    if role == "position":
        return rows, min(rows, seq), False
    padded = node.endswith(("word_embeddings", "embed_tokens")) and config.get("pad_token_id") == NS_INPUT_ID
    return rows, 1, padded


def embedding_backward_bytes(indices: int, hidden: int, rows: int, distinct: int, padded: bool) -> int:
    """Bytes PyTorch 2.1's CUDA embedding backward moves (fp32 gradients, int64 indices).

    The zero-filled table (rows x hidden) and the indices always; the output gradient's rows read and the distinct
    rows accumulated into (read and written), except where every index is padding_idx (the single kernel skips them);
    above EMBEDDING_SORT_ABOVE indices also the sort (keys and positions in and out, the positions' arange) and the
    partial sums (written, read back).
    """
    moved = 4 * rows * hidden + 8 * indices
    sorted_path = indices > EMBEDDING_SORT_ABOVE
    if sorted_path or not padded:
        moved += 4 * indices * hidden + 2 * 4 * distinct * hidden
    if sorted_path:
        run = math.ceil(indices / distinct)
        partials = distinct * math.ceil(run / EMBEDDING_ROWS_PER_PARTIAL)
        moved += 5 * 8 * indices + 2 * 4 * partials * hidden
    return moved


def ns_label_rows(repo: str, files: list[str]) -> tuple[list[dict], Counter]:
    rows, skipped, configs = [], Counter(), {}
    pat = re.compile(r"scripts/asplos/label/([^/]+)/(.+)-(inf|train)-(\d+)-(\d+)\.csv$")
    for f in files:
        m = pat.match(f)
        if not m:
            continue
        dev = NS_LABEL_DIR_DEVICE.get(m.group(1))
        if dev is None:
            continue  # AMD GPUs
        model, mode, seq, bs = m.group(2), m.group(3), int(m.group(4)), int(m.group(5))
        df = read_csv(repo, f)
        if df is None:
            skipped["unreadable file"] += 1
            continue
        for _, r in df.iterrows():
            if r["op"] not in ("call_module", "call_function", "call_method"):
                continue
            if str(r.get("dtype")) != "torch.float32":
                continue
            tgt = re.sub(r" at 0x[0-9a-f]+", "", str(r["target"]))
            ins = _shape_list(r["input_shapes"])
            out = _lit(r["output_shape"])
            if not (isinstance(out, tuple) and all(isinstance(i, int) for i in out)):
                continue
            out = list(out)
            out_n = prod(out)
            if out_n <= 1:
                continue
            kind = None
            if r["op"] == "call_module":
                cls = re.findall(r"<class '([^']+)'>", str(r["meta"]))
                kind = MODULE_OPS.get(cls[-1] if cls else "")
            elif r["op"] == "call_function":
                if tgt in ("<built-in method matmul of type object>", "<built-in method bmm of type object>",
                           "<built-in method addmm of type object>"):
                    kind = "gemm"
                elif tgt == "<function softmax>":
                    kind = "softmax"
                elif tgt == "<function embedding>":
                    kind = "embedding"
                elif tgt in ELEMENTWISE_FUNCS:
                    kind = "elementwise:" + ELEMENTWISE_FUNCS[tgt]
            else:
                if tgt in ELEMENTWISE_METHODS:
                    kind = "elementwise:" + ELEMENTWISE_METHODS[tgt]
                elif tgt in ("contiguous", "clone"):
                    kind = "copy"
            if kind is None:
                continue
            op, sub = (kind.split(":") + [""])[:2]
            # dropout is the identity in eval mode and for p=0 (no grad_fn => bw_latency==0): no kernel
            if sub == "dropout" and (mode == "inf" or float(r["bw_latency"]) == 0.0):
                skipped["dropout identity (eval or p=0)"] += 1
                continue
            fields = dict(batch="", m="", n="", k="", hidden="", seq_len=seq)
            in_n = sum(prod(s) for s in ins if prod(s) > 1)
            if op == "gemm":
                if tgt.startswith("<built-in method addmm"):
                    if len(ins) < 3:
                        continue
                    mm, kk = ins[1]; nn = ins[2][-1]; bb = 1; desc = "addmm"
                elif r["op"] == "call_module":
                    if not ins:
                        continue
                    kk = ins[0][-1]; nn = out[-1]; mm = prod(ins[0][:-1]); bb = 1; desc = "nn.Linear"
                else:
                    if len(ins) < 2:
                        continue
                    A, B = ins[0], ins[1]
                    if len(B) == 2:
                        bb, mm, kk, nn = 1, prod(A[:-1]), A[-1], B[-1]
                    else:
                        bb, mm, kk, nn = prod(A[:-2]), A[-2], A[-1], B[-1]
                    desc = "bmm" if bb > 1 else "matmul"
                fl = 2 * bb * mm * nn * kk
                fw_bytes = 4 * bb * (mm * kk + kk * nn + mm * nn)
                bw_bytes = 4 * bb * (mm * nn + 2 * mm * kk + 2 * kk * nn)
                fields.update(batch=bb, m=mm, n=nn, k=kk)
                fw_fl, bw_fl = fl, 2 * fl
            elif op == "embedding":
                idx_n = prod(ins[0]) if ins else out_n // out[-1]
                fields.update(batch=prod(out[:-1]), hidden=out[-1])
                fw_fl = bw_fl = out_n
                fw_bytes = 8 * idx_n + 4 * 2 * out_n
                table = ns_embedding_table(ns_model_config(repo, model, configs), str(r["Name"]), str(r["_args"]),
                                           ins, seq)
                if table is None:
                    bw_bytes = 8 * idx_n + 4 * 2 * out_n
                    if mode == "train":
                        skipped["embedding table unknown (backward bytes without the zero-filled table)"] += 1
                else:
                    bw_bytes = embedding_backward_bytes(idx_n, out[-1], *table)
                desc = "embedding"
            elif op in ("layernorm", "softmax"):
                fields.update(batch=out_n // out[-1], hidden=out[-1])
                fw_fl = bw_fl = out_n
                fw_bytes = 4 * (2 * out_n + (2 * out[-1] if op == "layernorm" else 0))
                # PyTorch 2.1's CUDA softmax backward is two kernels: tmp = dy * y (reads 2 tensors, writes 1),
                # then the softmax-backward kernel (reads tmp and y, writes dx): 6 tensors, not 3.
                bw_bytes = 4 * 6 * out_n if op == "softmax" else int(1.5 * fw_bytes)
                desc = op
            else:  # elementwise / copy
                fields.update(batch=out_n // out[-1], hidden=out[-1])
                fw_fl = bw_fl = out_n
                fw_bytes = 4 * (in_n + out_n)
                bw_bytes = int(1.5 * fw_bytes)
                desc = sub or op
            note = f"{model} {mode} b{bs} s{seq} {desc} {r['Name']}"
            base = dict(source="neusight", source_path=f, license=NS_LICENSE, device=dev,
                        framework=NS_FRAMEWORK + "/hf-transformers-fx", precision="fp32", op=op, **fields)
            fw = float(r["fw_latency"])
            if fw > 0:
                rows.append(blank_row(**base, phase="forward", flops=fw_fl, bytes=fw_bytes,
                                      measured_seconds=fw * 1e-3, notes=note, _sub="model"))
            bw = float(r["bw_latency"])
            if (bw > 0 and sub in ("add", "sub") and ins
                    and all(sh == out for sh in ins if prod(sh) > 1)):
                # AddBackward/SubBackward without broadcasting just hands the gradient on: no kernel
                skipped["pass-through add/sub backward"] += 1
                bw = 0.0
            if mode == "train" and bw > 0:
                rows.append(blank_row(**base, phase="backward", flops=bw_fl, bytes=bw_bytes,
                                      measured_seconds=bw * 1e-3,
                                      notes=note,
                                      _sub="model"))
    return rows, skipped

# --------------------------------------------------------------------------------------
# DeepBench
# --------------------------------------------------------------------------------------
DB_LICENSE = "Apache-2.0"
DB_FILES = {
    # path: (device id, framework string)
    "results/train/DeepBench_NV_V100.xlsx": ("v100", "cuda10.1/cudnn7.6"),
    "results/train/DeepBench_NV_T4.xlsx": ("t4", "cuda10.1/cudnn7.6"),
    "results/train/DeepBench_NV_P100.xlsx": ("p100-pcie", "cuda8.0/cudnn6.0"),
    "results/train/DeepBench_NV_TitanXp.xlsx": ("titanxp", "cuda8.0/cudnn6.0"),
    "results/train/DeepBench_NV_1080Ti.xlsx": ("gtx1080ti", "cuda8.0/cudnn6.0"),
    "results/train/DeepBench_NV_TitanX_Pascal.xlsx": ("titanx-pascal", "cuda8/cudnn5"),
    "results/train/DeepBench_NV_TitanX.xlsx": ("titanx-maxwell", "cuda7.5/cudnn5"),
    "results/train/DeepBench_NV_M40.xlsx": ("m40", "cuda7.5/cudnn5"),
}


def db_sheet_precision(title: str, first_rows: list) -> tuple[str, str] | None:
    t = title.lower()
    if "spec" in t:
        return None
    if "mixed precision" in t:  # inference int8 sheets (not in DB_FILES anyway)
        return None
    if "psuedo" in t or "pseudo" in t:
        return "mixed", " pseudo-fp16"
    if "fp16" in t:
        return "mixed", " fp16-tc"
    if "fp32" in t:
        return "fp32", ""
    return None


def _num(x):
    if x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    try:
        return float(str(x).strip())
    except ValueError:
        return None


def _norm_header(h):
    h = "" if h is None else str(h).strip().lower()
    h = re.sub(r"\s+", " ", h)
    if h.startswith("s (filter width)"):
        return "S"
    if h.startswith("r (filter height)"):
        return "R"
    if h in ("w", "h", "c", "n", "k", "r", "s", "m", "p", "q"):
        return h.upper()
    if h.startswith("horizontal stride"):
        return "stride_w"
    if h.startswith("vertical stride"):
        return "stride_h"
    if h in ("pad_w", "pad_h"):
        return h
    if h.startswith("hidden"):
        return "hidden"
    if h.startswith("timesteps"):
        return "T"
    if h.startswith("time (msec)"):
        return "t"
    if h.startswith("forward (msec)") or h.startswith("time forward"):
        return "t_fwd"
    if h.startswith("wrt inputs") or h.startswith("time backward wrt input"):
        return "t_bwd_data"
    if h.startswith("wrt parameters") or h.startswith("time backward wrt weight") or h.startswith("time backward wrt param"):
        return "t_bwd_weight"
    if h.startswith("time backward"):
        return "t_bwd"
    if h.startswith("a transpose"):
        return "ta"
    if h.startswith("b transpose"):
        return "tb"
    if h.startswith("forward algorithm"):
        return "algo"
    return h


def db_rows(repo: str) -> tuple[list[dict], list[str]]:
    import openpyxl
    rows, log = [], []
    for path, (dev, fw) in DB_FILES.items():
        b = git_show(repo, path)
        if b is None:
            log.append(f"missing {path}")
            continue
        wb = openpyxl.load_workbook(io.BytesIO(b), data_only=True, read_only=True)
        for ws in wb.worksheets:
            data = [list(r) for r in ws.iter_rows(values_only=True)]
            prec = db_sheet_precision(ws.title, data[:3])
            if prec is None:
                continue
            precision, prec_note = prec
            bpe = BPE[precision]
            section, header = None, None
            i = 0
            while i < len(data):
                row = data[i]
                c0 = "" if row[0] is None else str(row[0])
                title = None
                for key, sec in (("Dense Matrix", "gemm"), ("Sparse Matrix", None), ("Convolution", "conv2d"),
                                 ("Recurrent Layers - Vanilla", "rnn"), ("Recurrent Layers - LSTM", "lstm"),
                                 ("Recurrent Layers - GRU", "gru"), ("All-Reduce", None)):
                    if c0.startswith(key):
                        title = sec if sec else "skip"
                if title is not None:
                    section = title
                    hdr = [_norm_header(h) for h in row]
                    if "N" not in hdr:  # header on the next row (convolution)
                        i += 1
                        hdr = [_norm_header(h) for h in data[i]]
                    header = {h: j for j, h in enumerate(hdr) if h}
                    i += 1
                    continue
                i += 1
                if section in (None, "skip"):
                    continue

                def g(name):
                    j = header.get(name)
                    return None if j is None or j >= len(row) else row[j]
                src = row[1] if len(row) > 1 and isinstance(row[1], str) else ""
                base = dict(source="deepbench", source_path=f"{path}#{ws.title}", license=DB_LICENSE,
                            device=dev, framework=fw, precision=precision)
                if section == "gemm":
                    M, N, K, t = (_num(g(x)) for x in ("M", "N", "K", "t"))
                    if None in (M, N, K, t) or t <= 0:
                        continue
                    M, N, K = int(M), int(N), int(K)
                    rows.append(blank_row(**base, op="gemm", phase="forward", batch=1, m=M, n=N, k=K,
                                          flops=2 * M * N * K, bytes=bpe * (M * K + K * N + M * N),
                                          measured_seconds=t * 1e-3,
                                          notes=f"{src} {g('ta')}{g('tb')}{prec_note}",
                                          _sub="db"))
                elif section == "conv2d":
                    vals = {x: _num(g(x)) for x in ("W", "H", "C", "N", "K", "R", "S", "pad_w", "pad_h", "stride_w", "stride_h")}
                    if any(v is None for v in vals.values()):
                        continue
                    W, H, C, Nb, Ko, R, S, pw, ph, sw, sh = (int(vals[x]) for x in ("W", "H", "C", "N", "K", "R", "S", "pad_w", "pad_h", "stride_w", "stride_h"))
                    oh = (H + 2 * ph - R) // sh + 1
                    ow = (W + 2 * pw - S) // sw + 1
                    fl = 2 * Nb * oh * ow * Ko * R * S * C
                    nb = bpe * (Nb * C * H * W + Ko * C * R * S + Nb * Ko * oh * ow)
                    stride = sh if sh == sw else f"{sh}x{sw}"
                    padding = ph if ph == pw else f"{ph}x{pw}"
                    for ph_name, key in (("forward", "t_fwd"), ("backward_data", "t_bwd_data"), ("backward_weight", "t_bwd_weight")):
                        t = _num(g(key))
                        if t is None or t <= 0:
                            continue
                        algo = f" fwd_algo={g('algo')}" if ph_name == "forward" and g("algo") else ""
                        rows.append(blank_row(**base, op="conv2d", phase=ph_name, batch=Nb, in_h=H, in_w=W, in_c=C,
                                              out_c=Ko, kernel_h=R, kernel_w=S, stride=stride, padding=padding,
                                              flops=fl, bytes=nb, measured_seconds=t * 1e-3,
                                              notes=f"{src} out={oh}x{ow}{algo}{prec_note}", _sub="db"))
                else:  # rnn / lstm / gru
                    Hd, Nb, T = (_num(g(x)) for x in ("hidden", "N", "T"))
                    if None in (Hd, Nb, T):
                        continue
                    Hd, Nb, T = int(Hd), int(Nb), int(T)
                    gates = {"rnn": 1, "lstm": 4, "gru": 3}[section]
                    fwd_fl = 2 * gates * Hd * (0 + Hd) * Nb * T  # CUDNN_SKIP_INPUT: no input GEMM
                    nb = bpe * (2 * T * Nb * Hd + gates * Hd * Hd + 2 * Nb * Hd * (2 if section == "lstm" else 1))
                    for ph_name, key, mult in (("forward", "t_fwd", 1), ("backward_data", "t_bwd_data", 1),
                                               ("backward_weight", "t_bwd_weight", 1), ("backward", "t_bwd", 2)):
                        t = _num(g(key))
                        if t is None or t <= 0:
                            continue
                        rows.append(blank_row(**base, op=section, phase=ph_name, batch=Nb, hidden=Hd, input_size=0,
                                              seq_len=T, flops=fwd_fl * mult, bytes=nb, measured_seconds=t * 1e-3,
                                              notes=f"{src}{prec_note}",
                                              _sub="db"))
    return rows, log

# --------------------------------------------------------------------------------------
# peak check, subsampling, output
# --------------------------------------------------------------------------------------

CONV_FAST_ALGORITHM_LIMIT = 4.5


def peak_for(spec: dict, precision: str) -> float | None:
    key = {"fp32": "peak_float32_flops_per_s", "tf32": "peak_tf32_flops_per_s",
           "fp16": "peak_float16_flops_per_s", "mixed": "peak_float16_flops_per_s"}[precision]
    v = spec.get(key)
    return float(v) if v not in (None, "") else None


def stratified(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """Deterministic subsample of n rows spread evenly over sorted log(flops) (ties: by bytes, time)."""
    if len(df) <= n:
        return df
    d = df.sort_values(["flops", "bytes", "measured_seconds", "notes"], kind="mergesort")
    idx = np.unique(np.round(np.linspace(0, len(d) - 1, n)).astype(int))
    return d.iloc[idx]


def cap_group(g: pd.DataFrame, cap: int) -> pd.DataFrame:
    if len(g) <= cap:
        return g
    subs = sorted(g["_sub"].unique())
    # model-derived rows first (up to half the cap), the rest is shared evenly by micro sub-groups
    keep = []
    budget = cap
    if "model" in subs:
        mg = stratified(g[g["_sub"] == "model"], cap // 2)
        keep.append(mg)
        budget -= len(mg)
        subs.remove("model")
    sizes = {s: int((g["_sub"] == s).sum()) for s in subs}
    alloc = {s: 0 for s in subs}
    left = budget
    while left > 0 and any(alloc[s] < sizes[s] for s in subs):
        open_ = [s for s in subs if alloc[s] < sizes[s]]
        share = max(1, left // len(open_))
        for s in open_:
            add = min(share, sizes[s] - alloc[s], left)
            alloc[s] += add
            left -= add
            if left == 0:
                break
    for s in subs:
        keep.append(stratified(g[g["_sub"] == s], alloc[s]))
    return pd.concat(keep)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--neusight", default=DEFAULT_NEUSIGHT)
    ap.add_argument("--deepbench", default=DEFAULT_DEEPBENCH)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args()
    out = Path(args.out)

    print("NeuSight HEAD", git_head(args.neusight), "DeepBench HEAD", git_head(args.deepbench))
    ns_files = git_ls(args.neusight)
    rows = ns_micro_rows(args.neusight, ns_files)
    print("neusight micro rows", len(rows))
    lrows, lskipped = ns_label_rows(args.neusight, ns_files)
    print("neusight model rows", len(lrows), dict(lskipped))
    drows, dlog = db_rows(args.deepbench)
    print("deepbench rows", len(drows), dlog)

    df = pd.DataFrame(lrows + rows + drows)
    # de-duplicate identical measurements of the same shape on the same device (train/test overlap)
    keycols = ["source", "device", "precision", "op", "phase", "batch", "m", "n", "k", "in_h", "in_w", "in_c",
               "out_c", "kernel_h", "kernel_w", "stride", "padding", "hidden", "input_size", "seq_len", "_sub"]
    df["_k"] = df[keycols].astype(str).agg("|".join, axis=1)
    before = len(df)
    df = df[~(df["_sub"].str.startswith("micro") & df.duplicated("_k"))]
    print("dropped duplicate micro shapes:", before - len(df))

    # peak check
    specs = {s["id"]: s for s in GPU_SPECS}
    over = []
    ok = []
    for i, r in df.iterrows():
        sp = specs[r["device"]]
        # P100 "pseudo-FP16" keeps fp16 storage but computes in fp32: its ceiling is the fp32 peak
        pk = peak_for(sp, "fp32" if "pseudo-fp16" in str(r["notes"]) else r["precision"])
        ach = float(r["flops"]) / float(r["measured_seconds"])
        bw = float(r["bytes"]) / float(r["measured_seconds"]) / float(sp["memory_bandwidth_bytes_per_s"])
        # cuDNN's Winograd (up to 4x fewer multiplies for 3x3) and FFT convolutions beat the direct-convolution
        # FLOP count: a conv is kept up to CONV_FAST_ALGORITHM_LIMIT x the peak, anything else must stay under it
        limit = CONV_FAST_ALGORITHM_LIMIT if r["op"] == "conv2d" else 1.0
        if pk is not None and r["op"] in ("gemm", "conv2d", "lstm", "gru", "rnn") and ach > pk * limit:
            over.append((r["source"], r["device"], r["op"], r["phase"], r["precision"], "flops>peak", ach / pk, r["notes"][:90]))
            ok.append(False)
        elif (r["_sub"] == "model" and r["op"] not in ("gemm",) and bw > 1.5
              and float(r["bytes"]) > float(sp["l2_bytes"])):
            # working set far larger than L2 yet moved faster than DRAM: no kernel ran
            # (contiguous() on a contiguous tensor, pass-through AddBackward, ...)
            over.append((r["source"], r["device"], r["op"], r["phase"], r["precision"], "no-kernel(bytes/s>1.5xDRAM,bytes>L2)", bw, r["notes"][:90]))
            ok.append(False)
        else:
            ok.append(True)
    df = df[ok]
    over_df = pd.DataFrame(over, columns=["source", "device", "op", "phase", "precision", "reason", "ratio", "notes"])
    over_df.to_csv(HERE / "dropped_rows.csv", index=False)
    print("rows dropped (see dropped_rows.csv):", len(over_df))
    if len(over_df):
        print(over_df.groupby(["reason", "source", "device", "op", "phase", "precision"]).size().to_string())

    # bandwidth sanity report (not a drop criterion: small working sets are L2-resident)
    df["_bw_frac"] = [float(r["bytes"]) / float(r["measured_seconds"]) / float(specs[r["device"]]["memory_bandwidth_bytes_per_s"])
                      for _, r in df.iterrows()]

    # cap per group
    parts = []
    for key, g in df.groupby(["source", "device", "op", "phase", "precision"], sort=True):
        parts.append(cap_group(g, CAP if key[2] in ("gemm", "conv2d", "lstm", "gru", "rnn") else CAP_MEMORY_BOUND))
    df = pd.concat(parts)
    nbw = int((df["_bw_frac"] > 1.0).sum())
    print(f"kept rows with bytes/s above DRAM bandwidth (L2-resident, kept): {nbw}")
    df = df.sort_values(["source", "device", "op", "phase", "precision", "flops", "notes"], kind="mergesort")
    df["measured_seconds"] = df["measured_seconds"].map(lambda x: f"{x:.6g}")
    df[COLUMNS].to_csv(out / "measurements.csv", index=False)

    counts = df.groupby(["device", "op", "phase", "precision", "source"]).size().reset_index(name="rows")
    counts.to_csv(HERE / "row_counts.csv", index=False)
    print(counts.to_string())
    print("total rows", len(df))

    used = sorted(df["device"].unique())
    measured = out / "measured.csv"  # tbs's own GPU rows (build_measured.py) need their GPUs' datasheets too
    kept = set(used) | (set(pd.read_csv(measured)["device"].astype(str)) if measured.exists() else set())
    sp = pd.DataFrame([s for s in GPU_SPECS if s["id"] in kept])
    sp.to_csv(out / "gpu_specs.csv", index=False)
    missing = set(used) - set(sp["id"])
    assert not missing, missing


if __name__ == "__main__":
    main()
