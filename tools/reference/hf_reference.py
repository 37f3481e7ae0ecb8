# An fp32 PyTorch transcription (full recompute, no KV cache) of transformers' modeling
# code for the families Tessera serves, written from transformers' sources independently of
# Tessera's C++: check_variants.py runs it against tessera-generate on config variants the
# fixtures do not cover. Needs Debian's python3-torch (not installed by install_deps.sh;
# nothing in CI runs it). BLOOM is not transcribed (its fixtures cover it).
# Usage: hf_reference.py MODEL_DIR "1,2,3;4,5" N_NEW OUT.json (greedy ids and logits per prompt)
import json, math, struct, sys
import numpy as np
import torch

torch.set_grad_enabled(False)

def load_st(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == '__metadata__':
            continue
        assert v['dtype'] == 'F32', v['dtype']
        a, b = v['data_offsets']
        out[k] = torch.from_numpy(np.frombuffer(data[a:b], dtype=np.float32).copy()).reshape(v['shape'])
    return out

def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

ACT = {'silu': torch.nn.functional.silu, 'gelu': lambda x: torch.nn.functional.gelu(x),
       'gelu_new': gelu_tanh, 'gelu_pytorch_tanh': lambda x: torch.nn.functional.gelu(x, approximate='tanh'),
       'gelu_fast': gelu_tanh}

def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

def inv_freq(dim, base, scaling):
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if scaling is None:
        return inv
    t = scaling.get('rope_type', scaling.get('type'))
    if t == 'default':
        return inv
    if t == 'linear':
        return inv / scaling['factor']
    if t == 'llama3':
        factor = scaling['factor']; lo = scaling['low_freq_factor']; hi = scaling['high_freq_factor']
        old = scaling['original_max_position_embeddings']
        low_wl = old / lo; high_wl = old / hi
        wl = 2 * math.pi / inv
        out = torch.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        sm = (1 - smooth) * out / factor + smooth * out
        med = ~(wl < high_wl) * ~(wl > low_wl)
        return torch.where(med, sm, out)
    raise SystemExit('rope ' + str(t))

def rope(x, pos, inv, rot):
    # x [heads, T, D]; rotate the first `rot` dims.
    freqs = pos[:, None].float() * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    xr, xp = x[..., :rot], x[..., rot:]
    xr = xr * cos + rotate_half(xr) * sin
    return torch.cat((xr, xp), dim=-1)

class Model:
    def __init__(self, d):
        self.c = json.load(open(d + '/config.json'))
        self.w = load_st(d + '/model.safetensors')
        self.t = self.c['model_type']

    def g(self, k, default=None):
        v = self.c.get(k, default)
        return default if v is None else v

    def norm(self, x, name, layer_norm, gemma=False, eps=None):
        w = self.w[name + '.weight']
        if layer_norm:
            return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, self.w[name + '.bias'], eps)
        v = x.pow(2).mean(-1, keepdim=True)
        y = x * torch.rsqrt(v + eps)
        return y * (1.0 + w) if gemma else y * w

    def lin(self, x, name, conv=False):
        w = self.w[name + '.weight']
        b = self.w.get(name + '.bias')
        y = x @ w if conv else x @ w.t()
        return y + b if b is not None else y

    def forward(self, ids):
        c, t, W = self.c, self.t, self.w
        T = len(ids)
        ids_t = torch.tensor(ids)
        pos = torch.arange(T)
        if t == 'gpt2':
            H = c['n_embd']; nh = c['n_head']; L = c['n_layer']
        else:
            H = c['hidden_size']; nh = c['num_attention_heads']; L = c['num_hidden_layers']
        D = c.get('head_dim') or H // nh
        if t in ('qwen2', 'phi3', 'starcoder2', 'falcon', 'gpt_neox', 'gpt2', 'qwen2_moe', 'granite', 'minicpm'):
            D = H // nh
        kv = c.get('num_key_value_heads') or nh
        pre = {'gpt2': 'transformer.', 'falcon': 'transformer.', 'gpt_neox': 'gpt_neox.'}.get(t, 'model.')
        if t == 'gpt2':
            x = W['transformer.wte.weight'][ids_t] + W['transformer.wpe.weight'][pos]
        elif t == 'falcon':
            x = W['transformer.word_embeddings.weight'][ids_t]
        elif t == 'gpt_neox':
            x = W['gpt_neox.embed_in.weight'][ids_t]
        else:
            x = W['model.embed_tokens.weight'][ids_t]
        if t in ('gemma2', 'gemma3_text'):
            x = x * torch.tensor(H ** 0.5, dtype=x.dtype)
        if t == 'granite':  # GraniteModel: inputs_embeds * embedding_multiplier (a Python float)
            x = x * self.g('embedding_multiplier', 1.0)
        resid = self.g('residual_multiplier', 1.0) if t == 'granite' else 1.0
        if t == 'minicpm':  # modeling_minicpm: scale_emb, scale_depth / sqrt(layers), hidden / dim_model_base
            x = x * c['scale_emb']
            resid = c['scale_depth'] / math.sqrt(L)
        # SmolLM3Config: no_rope_layers (1 = rotary), else every no_rope_layer_interval-th layer is NoPE
        interval = self.g('no_rope_layer_interval', 4)
        use_rope = self.g('no_rope_layers', [int((i + 1) % interval != 0) for i in range(L)]) if t == 'smollm3' else [1] * L
        ln = t in ('falcon', 'gpt_neox', 'gpt2', 'starcoder2')
        gemma = t in ('gemma2', 'gemma3_text')
        eps = c.get('rms_norm_eps') or c.get('layer_norm_epsilon') or c.get('layer_norm_eps') or c.get('norm_epsilon') or 1e-5
        act = ACT[c.get('hidden_act') or c.get('hidden_activation') or c.get('activation_function') or c.get('activation') or 'silu']
        # falcon flags
        new_arch = c.get('new_decoder_architecture', False)
        mq = c.get('multi_query', True)
        parallel = c.get('parallel_attn', True) if t == 'falcon' else c.get('use_parallel_residual', True) if t == 'gpt_neox' else False
        if t == 'falcon':
            kv = c.get('num_kv_heads') or nh if new_arch else (1 if mq else nh)
            if new_arch:
                parallel = True
        n_ln = c.get('num_ln_in_parallel_attn') or 2
        for l in range(L):
            p = {'gpt2': f'transformer.h.{l}.', 'falcon': f'transformer.h.{l}.', 'gpt_neox': f'gpt_neox.layers.{l}.'}.get(t, f'model.layers.{l}.')
            # norms
            if t == 'gpt2':
                h = self.norm(x, p + 'ln_1', True, eps=eps)
            elif t == 'falcon' and new_arch and n_ln == 2:
                h = self.norm(x, p + 'ln_attn', True, eps=eps)
                hm = self.norm(x, p + 'ln_mlp', True, eps=eps)
            else:
                h = self.norm(x, p + 'input_layernorm', ln, gemma, eps)
            # qkv
            if t == 'gpt2':
                qkv = self.lin(h, p + 'attn.c_attn', conv=True)
                q, k, v = qkv.split(H, dim=-1)
                q = q.view(T, nh, D); k = k.view(T, nh, D); v = v.view(T, nh, D)
            elif t == 'phi3':
                qkv = self.lin(h, p + 'self_attn.qkv_proj')
                q = qkv[:, :nh * D].view(T, nh, D); k = qkv[:, nh * D:(nh + kv) * D].view(T, kv, D)
                v = qkv[:, (nh + kv) * D:].view(T, kv, D)
            elif t == 'falcon':
                qkv = self.lin(h, p + 'self_attention.query_key_value')
                if new_arch:
                    qkv = qkv.view(T, kv, nh // kv + 2, D)
                    q = qkv[:, :, :-2].reshape(T, nh, D); k = qkv[:, :, -2]; v = qkv[:, :, -1]
                elif mq:
                    qkv = qkv.view(T, nh + 2, D)
                    q = qkv[:, :-2]; k = qkv[:, -2:-1]; v = qkv[:, -1:]
                else:
                    qkv = qkv.view(T, nh, 3, D)
                    q = qkv[:, :, 0]; k = qkv[:, :, 1]; v = qkv[:, :, 2]
            elif t == 'gpt_neox':
                qkv = self.lin(h, p + 'attention.query_key_value').view(T, nh, 3 * D)
                q = qkv[..., :D]; k = qkv[..., D:2 * D]; v = qkv[..., 2 * D:]
            else:
                q = self.lin(h, p + 'self_attn.q_proj').view(T, nh, D)
                k = self.lin(h, p + 'self_attn.k_proj').view(T, kv, D)
                v = self.lin(h, p + 'self_attn.v_proj').view(T, kv, D)
            q = q.transpose(0, 1); k = k.transpose(0, 1); v = v.transpose(0, 1)
            if t in ('qwen3', 'qwen3_moe', 'gemma3_text'):
                q = self.norm(q, p + 'self_attn.q_norm', False, gemma, eps)
                k = self.norm(k, p + 'self_attn.k_norm', False, gemma, eps)
            # positions
            sliding = False
            if 'layer_types' in c and c['layer_types'] is not None:
                sliding = c['layer_types'][l] == 'sliding_attention'
            elif t == 'gemma2':
                sliding = not bool(l % 2)
            elif t == 'gemma3_text':
                sliding = bool((l + 1) % c.get('sliding_window_pattern', 6))
            elif t in ('mistral', 'starcoder2', 'phi3', 'mixtral'):
                sliding = c.get('sliding_window') is not None
            elif t in ('qwen2', 'qwen3', 'qwen2_moe', 'qwen3_moe'):
                sliding = c.get('use_sliding_window', False) and c.get('sliding_window') is not None and l >= c.get('max_window_layers', 28)
            elif t == 'smollm3':  # layer_types' default: the NoPE layers slide when use_sliding_window
                sliding = c.get('use_sliding_window', False) and c.get('sliding_window') is not None and not use_rope[l]
            if t == 'smollm3' and not c.get('use_sliding_window', False):
                sliding = False
            win = c.get('sliding_window') if sliding else None
            if t != 'gpt2' and use_rope[l]:
                rot = D
                if t == 'gpt_neox':
                    rot = int(D * c.get('rotary_pct', 1.0))
                if t == 'phi3':
                    rot = int(D * c.get('partial_rotary_factor', 1.0))
                base = c.get('rope_theta') or c.get('rotary_emb_base') or 10000.0
                scaling = c.get('rope_scaling')
                if t == 'gemma3_text' and sliding:
                    base = c.get('rope_local_base_freq', 10000.0); scaling = None
                inv = inv_freq(rot, base, scaling)
                q = rope(q, pos, inv, rot); k = rope(k, pos, inv, rot)
            if kv != nh:
                k = k.repeat_interleave(nh // kv, dim=0); v = v.repeat_interleave(nh // kv, dim=0)
            scale = 1.0 / math.sqrt(D)
            if gemma:
                scale = c.get('query_pre_attn_scalar', 256) ** -0.5
            if t == 'gpt2':
                scale = scale if c.get('scale_attn_weights', True) else 1.0
            if t == 'granite':  # GraniteAttention: scaling = attention_multiplier
                scale = self.g('attention_multiplier', 1.0)
            s = (q @ k.transpose(-1, -2)) * scale
            if t == 'gpt2' and c.get('scale_attn_by_inverse_layer_idx', False):
                s = s / float(l + 1)
            cap = c.get('attn_logit_softcapping') if gemma else None
            if cap:
                s = torch.tanh(s / cap) * cap
            qi = torch.arange(T)[:, None]; ki = torch.arange(T)[None, :]
            mask = ki <= qi
            if win is not None:
                mask = mask & (ki > qi - win)
            s = s.masked_fill(~mask, float('-inf'))
            a = torch.softmax(s, dim=-1) @ v
            a = a.transpose(0, 1).reshape(T, nh * D)
            if t == 'gpt2':
                a = self.lin(a, p + 'attn.c_proj', conv=True)
            elif t == 'falcon':
                a = self.lin(a, p + 'self_attention.dense')
            elif t == 'gpt_neox':
                a = self.lin(a, p + 'attention.dense')
            else:
                a = self.lin(a, p + 'self_attn.o_proj')
            if gemma:
                a = self.norm(a, p + 'post_attention_layernorm', False, True, eps)
            # mlp
            def mlp(hin):
                if t == 'gpt2':
                    return self.lin(act(self.lin(hin, p + 'mlp.c_fc', conv=True)), p + 'mlp.c_proj', conv=True)
                if t in ('falcon', 'gpt_neox'):
                    return self.lin(act(self.lin(hin, p + 'mlp.dense_h_to_4h')), p + 'mlp.dense_4h_to_h')
                if t == 'starcoder2':
                    return self.lin(act(self.lin(hin, p + 'mlp.c_fc')), p + 'mlp.c_proj')
                if t == 'phi3':
                    gu = self.lin(hin, p + 'mlp.gate_up_proj')
                    gt, up = gu.chunk(2, dim=-1)
                    return self.lin(up * act(gt), p + 'mlp.down_proj')
                moe_layer = False
                if t in ('qwen2_moe', 'qwen3_moe'):
                    moe_layer = l not in c.get('mlp_only_layers', []) and c['num_experts'] > 0 and (l + 1) % c.get('decoder_sparse_step', 1) == 0
                if t == 'mixtral':
                    moe_layer = True
                if not moe_layer:
                    return self.lin(act(self.lin(hin, p + 'mlp.gate_proj')) * self.lin(hin, p + 'mlp.up_proj'), p + 'mlp.down_proj')
                if t == 'mixtral':
                    router = p + 'block_sparse_moe.gate'; ex = lambda e: (p + f'block_sparse_moe.experts.{e}.w1', p + f'block_sparse_moe.experts.{e}.w3', p + f'block_sparse_moe.experts.{e}.w2')
                    E = c['num_local_experts']; norm_topk = True
                else:
                    router = p + 'mlp.gate'; ex = lambda e: (p + f'mlp.experts.{e}.gate_proj', p + f'mlp.experts.{e}.up_proj', p + f'mlp.experts.{e}.down_proj')
                    E = c['num_experts']; norm_topk = c.get('norm_topk_prob', False)
                logits = self.lin(hin, router)
                prob = torch.softmax(logits, dim=-1, dtype=torch.float)
                wts, sel = torch.topk(prob, c['num_experts_per_tok'], dim=-1)
                if norm_topk:
                    wts = wts / wts.sum(-1, keepdim=True)
                out = torch.zeros_like(hin)
                for ti in range(T):
                    for j in range(sel.shape[1]):
                        e = int(sel[ti, j]); gn, un, dn = ex(e)
                        y = self.lin(act(self.lin(hin[ti:ti + 1], gn)) * self.lin(hin[ti:ti + 1], un), dn)
                        out[ti] += wts[ti, j] * y[0]
                if t == 'qwen2_moe':
                    sh = self.lin(act(self.lin(hin, p + 'mlp.shared_expert.gate_proj')) * self.lin(hin, p + 'mlp.shared_expert.up_proj'), p + 'mlp.shared_expert.down_proj')
                    out = out + torch.sigmoid(self.lin(hin, p + 'mlp.shared_expert_gate')) * sh
                return out
            if t == 'gemma2' or t == 'gemma3_text':
                x = x + a
                m = mlp(self.norm(x, p + 'pre_feedforward_layernorm', False, True, eps))
                x = x + self.norm(m, p + 'post_feedforward_layernorm', False, True, eps)
            elif parallel:
                if t == 'falcon':
                    hmm = hm if (new_arch and n_ln == 2) else h
                else:
                    hmm = self.norm(x, p + 'post_attention_layernorm', True, eps=eps)
                x = x + a + mlp(hmm)
            else:
                x = x + a * resid
                nm = {'gpt2': 'ln_2'}.get(t, 'post_attention_layernorm')
                x = x + mlp(self.norm(x, p + nm, ln, gemma, eps)) * resid
        fn = {'gpt2': 'transformer.ln_f', 'falcon': 'transformer.ln_f', 'gpt_neox': 'gpt_neox.final_layer_norm'}.get(t, 'model.norm')
        x = self.norm(x, fn, ln, gemma, eps)
        head = W.get('lm_head.weight')
        if t == 'gpt_neox':
            head = W['embed_out.weight']
        if head is None:
            head = W[{'gpt2': 'transformer.wte.weight', 'falcon': 'transformer.word_embeddings.weight'}.get(t, 'model.embed_tokens.weight')]
        logits = x[-1] @ head.t()
        if t == 'granite':
            logits = logits / self.g('logits_scaling', 1.0)
        if t == 'minicpm':
            logits = logits / (H / c['dim_model_base'])
        cap = c.get('final_logit_softcapping') if gemma else None
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

def main():
    m = Model(sys.argv[1])
    prompts = [[int(v) for v in p.split(',')] for p in sys.argv[2].split(';')]
    n = int(sys.argv[3])
    res = []
    for pr in prompts:
        ids = list(pr); outs = []; rows = []
        for _ in range(n):
            lg = m.forward(ids)
            tok = int(torch.argmax(lg))
            outs.append(tok); rows.append(lg.tolist()); ids.append(tok)
        res.append({'greedy': outs, 'logits': rows})
    json.dump(res, open(sys.argv[4], 'w'))

main()
