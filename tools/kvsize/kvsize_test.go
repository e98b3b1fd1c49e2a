package kvsize

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func shipped(t *testing.T, name string) Model {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "models", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return m
}

func TestParseShippedConfigs(t *testing.T) {
	for _, tc := range []struct {
		name string
		want Model
	}{
		{"llama-3.1-8b", Model{ModelType: "llama", Attention: GQA, Layers: 32, AttentionHeads: 32, KVHeads: 8, HeadDim: 128, Dtype: "bfloat16"}},
		{"llama-3.1-70b", Model{ModelType: "llama", Attention: GQA, Layers: 80, AttentionHeads: 64, KVHeads: 8, HeadDim: 128, Dtype: "bfloat16"}},
		// MLA: one latent of kv_lora_rank 512 + qk_rope_head_dim 64.
		{"deepseek-v2-lite", Model{ModelType: "deepseek_v2", Attention: MLA, Layers: 27, AttentionHeads: 16, KVHeads: 1, HeadDim: 576, Dtype: "bfloat16"}},
	} {
		if got := shipped(t, tc.name); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestShippedSizes: the figures the README's table shows, by hand:
// Llama 3.1 8B: 32 layers × 2 × 8 KV heads × 128 × 2 bytes = 128 KiB a
// token; 70B: 80 layers, 320 KiB a token; DeepSeek-V2-Lite: 27 layers ×
// 576 × 2 bytes = 31104 bytes a token and worker, on every worker.
func TestShippedSizes(t *testing.T) {
	const pool = 64 << 30
	for _, tc := range []struct {
		model                     string
		tp, tokens                int
		perWorkerHeads            int
		bytesPerToken, worker     int64
		block, blocks, poolTokens int64
	}{
		{"llama-3.1-8b", 1, 16, 8, 131072, 2 << 20, 2 << 20, 32768, 524288},
		{"llama-3.1-8b", 1, 32, 8, 131072, 4 << 20, 4 << 20, 16384, 524288},
		{"llama-3.1-8b", 2, 16, 4, 131072, 1 << 20, 2 << 20, 32768, 524288},
		{"llama-3.1-8b", 8, 32, 1, 131072, 512 << 10, 4 << 20, 16384, 524288},
		// 8 KV heads on 16 workers: each head on two workers, twice the bytes.
		{"llama-3.1-8b", 16, 16, 1, 262144, 256 << 10, 4 << 20, 16384, 262144},
		{"llama-3.1-70b", 1, 16, 8, 327680, 5 << 20, 5 << 20, 13107, 209712},
		{"llama-3.1-70b", 1, 32, 8, 327680, 10 << 20, 10 << 20, 6553, 209696},
		{"llama-3.1-70b", 4, 32, 2, 327680, 2560 << 10, 10 << 20, 6553, 209696},
		{"llama-3.1-70b", 8, 16, 1, 327680, 640 << 10, 5 << 20, 13107, 209712},
		{"deepseek-v2-lite", 1, 16, 1, 31104, 497664, 497664, 138084, 2209344},
		{"deepseek-v2-lite", 1, 32, 1, 31104, 995328, 995328, 69042, 2209344},
		// The latent is replicated: every worker stores all of it.
		{"deepseek-v2-lite", 2, 16, 1, 62208, 497664, 995328, 69042, 1104672},
		{"deepseek-v2-lite", 8, 32, 1, 248832, 995328, 7962624, 8630, 276160},
	} {
		s, err := shipped(t, tc.model).Size(Options{TP: tc.tp, BlockTokens: tc.tokens, PoolBytes: pool})
		if err != nil {
			t.Fatalf("%s tp %d: %v", tc.model, tc.tp, err)
		}
		got := []int64{int64(s.KVHeadsPerWorker), s.BytesPerToken, s.WorkerBytesPerBlock, s.BlockBytes, s.PoolBlocks, s.PoolTokens}
		want := []int64{int64(tc.perWorkerHeads), tc.bytesPerToken, tc.worker, tc.block, tc.blocks, tc.poolTokens}
		for i, name := range []string{"kv_heads_per_worker", "bytes_per_token", "worker_bytes_per_block", "block_bytes", "pool_blocks", "pool_tokens"} {
			if got[i] != want[i] {
				t.Errorf("%s tp %d block %d: %s = %d, want %d", tc.model, tc.tp, tc.tokens, name, got[i], want[i])
			}
		}
		if s.TP != tc.tp || s.BlockTokens != tc.tokens || s.PoolBytes != pool || s.DtypeBytes != 2 || s.KVCacheDtype != "bfloat16" {
			t.Errorf("%s: settings echoed wrong: %+v", tc.model, s)
		}
	}
}

func TestDefaults(t *testing.T) {
	s, err := shipped(t, "llama-3.1-8b").Size(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.TP != 1 || s.BlockTokens != DefaultBlockTokens || s.PoolBytes != DefaultPoolBytes || s.PoolBlocks != 512 {
		t.Fatalf("defaults: %+v", s)
	}
}

func TestKVCacheDtype(t *testing.T) {
	bf16 := Model{Attention: MHA, Layers: 1, AttentionHeads: 1, KVHeads: 1, HeadDim: 1, Dtype: "bfloat16"}
	f32, none := bf16, bf16
	f32.Dtype, none.Dtype = "float32", ""
	for _, tc := range []struct {
		m     Model
		dtype string
		name  string
		bytes int
		err   error
	}{
		{bf16, "", "bfloat16", 2, nil},
		{bf16, "auto", "bfloat16", 2, nil},
		{Model{Attention: MHA, Layers: 1, AttentionHeads: 1, KVHeads: 1, HeadDim: 1, Dtype: "torch.float16"}, "auto", "float16", 2, nil},
		// vLLM's --dtype auto runs a float32 model in 16 bits.
		{f32, "auto", "bfloat16", 2, nil},
		{f32, "float32", "float32", 4, nil},
		{bf16, "fp8", "fp8", 1, nil},
		{bf16, "FP8_E4M3", "fp8_e4m3", 1, nil},
		{bf16, "fp8_e5m2", "fp8_e5m2", 1, nil},
		{none, "float16", "float16", 2, nil},
		{none, "auto", "", 0, ErrMissingField},
		{bf16, "fp8_ds_mla", "", 0, ErrBadDtype},
		{bf16, "nvfp4", "", 0, ErrBadDtype},
		{Model{Attention: MHA, Layers: 1, AttentionHeads: 1, KVHeads: 1, HeadDim: 1, Dtype: "int4"}, "auto", "", 0, ErrBadDtype},
	} {
		s, err := tc.m.Size(Options{KVCacheDtype: tc.dtype})
		if !errors.Is(err, tc.err) {
			t.Errorf("%q on %q: err %v, want %v", tc.dtype, tc.m.Dtype, err, tc.err)
			continue
		}
		if err == nil && (s.KVCacheDtype != tc.name || s.DtypeBytes != tc.bytes) {
			t.Errorf("%q on %q: %s (%d bytes), want %s (%d)", tc.dtype, tc.m.Dtype, s.KVCacheDtype, s.DtypeBytes, tc.name, tc.bytes)
		}
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		want       Model
	}{
		{"mha, head_dim from hidden_size", `{"model_type":"gpt","num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"torch_dtype":"float16"}`,
			Model{ModelType: "gpt", Attention: MHA, Layers: 2, AttentionHeads: 4, KVHeads: 4, HeadDim: 64, Dtype: "float16"}},
		{"explicit head_dim wins", `{"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":1,"hidden_size":256,"head_dim":128}`,
			Model{Attention: GQA, Layers: 2, AttentionHeads: 4, KVHeads: 1, HeadDim: 128}},
		{"null head_dim derives", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"head_dim":null}`,
			Model{Attention: MHA, Layers: 2, AttentionHeads: 4, KVHeads: 4, HeadDim: 64}},
		{"vLLM's kv-head keys, in its order", `{"num_hidden_layers":2,"num_attention_heads":8,"num_kv_heads":2,"num_key_value_heads":4,"head_dim":64}`,
			Model{Attention: GQA, Layers: 2, AttentionHeads: 8, KVHeads: 2, HeadDim: 64}},
		{"dtype (transformers 5) over torch_dtype", `{"num_hidden_layers":1,"num_attention_heads":1,"head_dim":8,"dtype":"float16","torch_dtype":"float32"}`,
			Model{Attention: MHA, Layers: 1, AttentionHeads: 1, KVHeads: 1, HeadDim: 8, Dtype: "float16"}},
		{"multimodal text_config", `{"model_type":"llava","torch_dtype":"bfloat16","vision_config":{"num_hidden_layers":24},
			"text_config":{"model_type":"llama","num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"hidden_size":4096}}`,
			Model{ModelType: "llava", Attention: GQA, Layers: 32, AttentionHeads: 32, KVHeads: 8, HeadDim: 128, Dtype: "bfloat16"}},
		{"text_config's dtype", `{"text_config":{"model_type":"llama","num_hidden_layers":1,"num_attention_heads":2,"hidden_size":8,"torch_dtype":"float16"}}`,
			Model{ModelType: "llama", Attention: MHA, Layers: 1, AttentionHeads: 2, KVHeads: 2, HeadDim: 4, Dtype: "float16"}},
		{"mla ignores K/V heads", `{"model_type":"deepseek_v3","num_hidden_layers":61,"num_attention_heads":128,"num_key_value_heads":128,
			"kv_lora_rank":512,"qk_rope_head_dim":64,"qk_nope_head_dim":128,"head_dim":192}`,
			Model{ModelType: "deepseek_v3", Attention: MLA, Layers: 61, AttentionHeads: 128, KVHeads: 1, HeadDim: 576}},
		{"null kv_lora_rank is not mla", `{"num_hidden_layers":1,"num_attention_heads":2,"hidden_size":8,"kv_lora_rank":null}`,
			Model{Attention: MHA, Layers: 1, AttentionHeads: 2, KVHeads: 2, HeadDim: 4}},
	} {
		got, err := Parse([]byte(tc.json))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		err        error
		field      string // the FieldError's, where it is one
	}{
		{"not json", `{"num_hidden_layers":`, ErrBadConfig, ""},
		{"not an object", `[1,2]`, ErrBadConfig, ""},
		{"wrong type", `{"num_hidden_layers":"32"}`, ErrBadConfig, ""},
		{"no layers", `{"num_attention_heads":4,"hidden_size":256}`, ErrMissingField, "num_hidden_layers"},
		{"no heads", `{"num_hidden_layers":2,"hidden_size":256}`, ErrMissingField, "num_attention_heads"},
		{"zero layers", `{"num_hidden_layers":0,"num_attention_heads":4,"hidden_size":256}`, ErrBadField, "num_hidden_layers"},
		{"no head_dim nor hidden_size", `{"num_hidden_layers":2,"num_attention_heads":4}`, ErrMissingField, "head_dim"},
		{"hidden_size below heads", `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":2}`, ErrBadField, "hidden_size"},
		{"zero kv heads", `{"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":0,"head_dim":8}`, ErrBadField, "num_key_value_heads"},
		{"text_config field named", `{"text_config":{"num_attention_heads":4,"head_dim":8}}`, ErrMissingField, "text_config.num_hidden_layers"},
		{"mla without rope dim", `{"num_hidden_layers":2,"num_attention_heads":4,"kv_lora_rank":512}`, ErrMissingField, "qk_rope_head_dim"},
		{"hybrid", `{"model_type":"jamba","num_hidden_layers":2,"num_attention_heads":4,"head_dim":8,"layers_block_type":["mamba","attention"]}`, ErrUnsupportedModel, ""},
		{"dsa indexer", `{"model_type":"deepseek_v32","num_hidden_layers":2,"num_attention_heads":4,"kv_lora_rank":512,"qk_rope_head_dim":64,"index_topk":2048}`, ErrUnsupportedModel, ""},
	} {
		_, err := Parse([]byte(tc.json))
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.err)
			continue
		}
		var fe *FieldError
		if tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field) {
			t.Errorf("%s: err %v, want a FieldError on %s", tc.name, err, tc.field)
		}
	}
}

func TestSizeErrors(t *testing.T) {
	m := shipped(t, "llama-3.1-8b")
	tiny := Model{Attention: MHA, Layers: 1, AttentionHeads: 1, KVHeads: 1, HeadDim: 1, Dtype: "fp8"}
	for _, tc := range []struct {
		name string
		m    Model
		o    Options
		err  error
	}{
		{"tp not dividing the heads", m, Options{TP: 3}, ErrBadOption},
		{"negative tp", m, Options{TP: -2}, ErrBadOption},
		{"negative block", m, Options{BlockTokens: -16}, ErrBadOption},
		{"negative pool", m, Options{PoolBytes: -1}, ErrBadOption},
		{"pool below one block", m, Options{PoolBytes: 1 << 20}, ErrBadOption},
		{"more slots than kvtierd takes", tiny, Options{BlockTokens: 1, PoolBytes: 1 << 40}, ErrBadOption},
		{"overflow", m, Options{BlockTokens: 1 << 62}, ErrBadOption},
		{"no model", Model{}, Options{}, ErrBadField},
	} {
		if _, err := tc.m.Size(tc.o); !errors.Is(err, tc.err) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.err)
		}
	}
}
