// Package kvsize owns the arithmetic of `kvtier size`: how many bytes of KV
// cache one offloaded block of a model takes, read from its Hugging Face
// config.json, and so how large kvtierd's slots (--block-bytes) must be and
// how many blocks and tokens a pool of a given size holds.
//
// It follows vLLM's own sizing (vLLM 0.32, the version kvtier_vllm is
// tested with): the model's geometry as vLLM's ModelConfig reads it
// (vllm/transformers_utils/model_arch_config_convertor.py: get_head_size,
// get_total_num_kv_heads; vllm/config/model.py: get_num_kv_heads, use_mla),
// a worker's page as its KV-cache spec computes it
// (vllm/v1/kv_cache_interface.py: FullAttentionSpec, MLAAttentionSpec), and a kvtier slot as the connector
// lays one out (clients/python/kvtier_vllm/layout.py, SlotGeometry): one
// offloaded block of every tensor-parallel worker, side by side.
//
// It is pure: it parses bytes and computes; the command reads the file and
// prints.
package kvsize

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
)

// The errors every failure wraps, for errors.Is.
var (
	// ErrBadConfig: the file is not a JSON object, or a key has the wrong
	// JSON type.
	ErrBadConfig = errors.New("not a model config.json")
	// ErrMissingField: a value the formula needs is absent (or null).
	ErrMissingField = errors.New("missing field")
	// ErrBadField: a value is present but unusable (zero, negative).
	ErrBadField = errors.New("bad field")
	// ErrUnsupportedModel: a model whose KV cache is not one page per
	// attention layer of one shape (hybrid models, extra indexer caches);
	// the formula would be wrong for it, so there is no answer.
	ErrUnsupportedModel = errors.New("unsupported model")
	// ErrBadDtype: an unknown KV-cache dtype, or a packed one whose size
	// is not a whole number of bytes per element.
	ErrBadDtype = errors.New("bad kv-cache dtype")
	// ErrBadOption: a tensor-parallel size, block size or pool size the
	// engine or kvtierd would refuse.
	ErrBadOption = errors.New("bad option")
)

// FieldError names the config.json key behind an ErrMissingField or
// ErrBadField.
type FieldError struct {
	Field string // as in the file: "num_hidden_layers", "text_config.head_dim"
	Why   string
	Err   error // ErrMissingField or ErrBadField
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("config.json: %s: %s", e.Field, e.Why)
}

func (e *FieldError) Unwrap() error { return e.Err }

// Attention is how a model's KV cache is shaped.
type Attention string

const (
	// MHA: one K and one V head per attention head.
	MHA Attention = "mha"
	// GQA: fewer K/V heads than attention heads (MQA included), shared by
	// groups of query heads.
	GQA Attention = "gqa"
	// MLA: one compressed latent per token and layer (DeepSeek-V2/V3),
	// no K/V pair, the same on every tensor-parallel worker.
	MLA Attention = "mla"
)

// Model is the KV-cache geometry of a model, as vLLM reads it from the
// config.
type Model struct {
	ModelType string
	Attention Attention
	// Layers is the number of attention layers, each with one KV page per
	// block.
	Layers int
	// AttentionHeads is the number of query heads: the tensor-parallel
	// size must divide it.
	AttentionHeads int
	// KVHeads is the number of K/V heads in the whole model; 1 for MLA
	// (vLLM: "when using MLA during decode it becomes MQA").
	KVHeads int
	// HeadDim is one head's width: for MLA the latent's,
	// kv_lora_rank + qk_rope_head_dim.
	HeadDim int
	// Dtype is the config's torch_dtype (or dtype), "" where it names none.
	Dtype string
}

// hfConfig is the part of a Hugging Face config.json that sizes the KV
// cache. Pointers tell absent (or null) from zero.
type hfConfig struct {
	ModelType  string    `json:"model_type"`
	TorchDtype string    `json:"torch_dtype"`
	Dtype      string    `json:"dtype"`
	TextConfig *hfConfig `json:"text_config"`

	NumHiddenLayers   *int `json:"num_hidden_layers"`
	NumAttentionHeads *int `json:"num_attention_heads"`
	HiddenSize        *int `json:"hidden_size"`
	HeadDim           *int `json:"head_dim"`

	// The K/V head counts vLLM looks for, in its order
	// (ModelArchConfigConvertorBase.get_total_num_kv_heads).
	NHeadKV            *int `json:"n_head_kv"`
	NumKVHeads         *int `json:"num_kv_heads"`
	NumKeyValueHeads   *int `json:"num_key_value_heads"`
	MultiQueryGroupNum *int `json:"multi_query_group_num"`
	NumAttentionGroups *int `json:"num_attention_groups"`

	KVLoraRank    *int `json:"kv_lora_rank"`
	QKRopeHeadDim *int `json:"qk_rope_head_dim"`

	// Present in models whose KV cache is not one page per attention layer
	// of one shape, which this formula would size wrong.
	CompressRatios        json.RawMessage `json:"compress_ratios"`
	IndexTopK             json.RawMessage `json:"index_topk"`
	LayersBlockType       json.RawMessage `json:"layers_block_type"`
	HybridOverridePattern json.RawMessage `json:"hybrid_override_pattern"`
	BlockConfigs          json.RawMessage `json:"block_configs"`
}

// unsupported says why a config's KV cache is not one page per attention
// layer of one shape, or "" when it is.
func (c *hfConfig) unsupported() string {
	switch {
	case present(c.CompressRatios):
		return "compress_ratios: DeepSeek-V4's compressed caches"
	case present(c.IndexTopK):
		return "index_topk: a sparse-attention indexer keeps a cache of its own beside the latent"
	case present(c.LayersBlockType), present(c.HybridOverridePattern):
		return "a hybrid model (attention beside state-space layers)"
	case present(c.BlockConfigs):
		return "block_configs: per-layer attention shapes"
	}
	return ""
}

func present(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// Parse reads a config.json. A multimodal config's text_config, where
// there is one, gives the geometry (vLLM's hf_text_config); the top level
// gives the model type, and the dtype where the text config names none.
// A config with a kv_lora_rank is MLA: vLLM's use_mla for the DeepSeek
// family it lists by model type, and for any such config under its
// Transformers backend.
func Parse(data []byte) (Model, error) {
	var top hfConfig
	if err := json.Unmarshal(data, &top); err != nil {
		return Model{}, fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	text, prefix := &top, ""
	if top.TextConfig != nil {
		text, prefix = top.TextConfig, "text_config."
	}
	if why := text.unsupported(); why != "" {
		return Model{}, fmt.Errorf("%w: %s (%s)", ErrUnsupportedModel, cmp.Or(top.ModelType, "model"), why)
	}
	m := Model{
		ModelType: cmp.Or(top.ModelType, text.ModelType),
		Dtype:     cmp.Or(top.Dtype, top.TorchDtype, text.Dtype, text.TorchDtype),
	}
	f := fields{prefix: prefix}
	m.Layers = f.positive("num_hidden_layers", text.NumHiddenLayers)
	m.AttentionHeads = f.positive("num_attention_heads", text.NumAttentionHeads)
	if f.err != nil {
		return Model{}, f.err
	}
	if text.KVLoraRank != nil {
		return f.mla(m, text)
	}
	return f.attention(m, text)
}

// mla is DeepSeek's multi-head latent attention: one latent of
// kv_lora_rank + qk_rope_head_dim per token and layer (vLLM's get_head_size
// with MLA on), one "KV head".
func (f *fields) mla(m Model, c *hfConfig) (Model, error) {
	rank := f.positive("kv_lora_rank", c.KVLoraRank)
	rope := f.positive("qk_rope_head_dim", c.QKRopeHeadDim)
	if f.err != nil {
		return Model{}, f.err
	}
	m.Attention, m.KVHeads, m.HeadDim = MLA, 1, rank+rope
	return m, nil
}

// attention is multi-head or grouped-query attention: a K and a V head of
// head_dim (default hidden_size / num_attention_heads) per KV head.
func (f *fields) attention(m Model, c *hfConfig) (Model, error) {
	m.KVHeads = m.AttentionHeads
	for _, k := range []struct {
		name string
		v    *int
	}{{"n_head_kv", c.NHeadKV}, {"num_kv_heads", c.NumKVHeads}, {"num_key_value_heads", c.NumKeyValueHeads},
		{"multi_query_group_num", c.MultiQueryGroupNum}, {"num_attention_groups", c.NumAttentionGroups}} {
		if k.v != nil {
			m.KVHeads = f.positive(k.name, k.v)
			break
		}
	}
	switch {
	case c.HeadDim != nil && *c.HeadDim > 0:
		m.HeadDim = *c.HeadDim
	case c.HiddenSize == nil:
		f.fail("head_dim", ErrMissingField, "absent, and no hidden_size to derive it from")
	default:
		m.HeadDim = f.positive("hidden_size", c.HiddenSize) / max(m.AttentionHeads, 1)
		if f.err == nil && m.HeadDim == 0 {
			f.fail("hidden_size", ErrBadField, fmt.Sprintf("%d is smaller than num_attention_heads %d", *c.HiddenSize, m.AttentionHeads))
		}
	}
	if f.err != nil {
		return Model{}, f.err
	}
	m.Attention = GQA
	if m.KVHeads == m.AttentionHeads {
		m.Attention = MHA
	}
	return m, nil
}

// fields checks a config's values, keeping the first fault.
type fields struct {
	prefix string
	err    error
}

func (f *fields) fail(name string, err error, why string) {
	if f.err == nil {
		f.err = &FieldError{Field: f.prefix + name, Why: why, Err: err}
	}
}

// positive is *v, which must be present and above zero.
func (f *fields) positive(name string, v *int) int {
	switch {
	case v == nil:
		f.fail(name, ErrMissingField, "absent")
		return 0
	case *v <= 0:
		f.fail(name, ErrBadField, fmt.Sprintf("%d, want a positive number", *v))
		return 0
	}
	return *v
}
