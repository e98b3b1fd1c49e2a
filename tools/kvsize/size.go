package kvsize

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"strings"
)

// Options are the engine's settings that size a block.
type Options struct {
	// TP is the tensor-parallel size (vLLM's --tensor-parallel-size); 0: 1.
	TP int
	// BlockTokens is the tokens of one offloaded block (the connector's
	// block_size, else vLLM's --block-size); 0: DefaultBlockTokens.
	BlockTokens int
	// KVCacheDtype is vLLM's --kv-cache-dtype; "" or "auto": the dtype the
	// model runs in (ModelDtype).
	KVCacheDtype string
	// PoolBytes is kvtierd's --pool-bytes; 0: DefaultPoolBytes.
	PoolBytes int64
}

const (
	// DefaultBlockTokens is vLLM's default --block-size.
	DefaultBlockTokens = 16
	// DefaultPoolBytes is kvtierd's default --pool-bytes.
	DefaultPoolBytes = 1 << 30
)

// Size is what one block of a model takes, in kvtier and in a pool. Its
// JSON is `kvtier size --json`.
type Size struct {
	ModelType string    `json:"model_type"`
	Attention Attention `json:"attention"`
	Layers    int       `json:"layers"`
	// KVHeads is the model's K/V heads (1 for MLA); KVHeadsPerWorker one
	// worker's: KVHeads / TP, at least 1 (vLLM replicates a KV head on
	// the workers that share it), 1 for MLA (the latent is replicated).
	KVHeads          int `json:"kv_heads"`
	KVHeadsPerWorker int `json:"kv_heads_per_worker"`
	HeadDim          int `json:"head_dim"`
	// KVCacheDtype is the dtype the cache is stored in (auto resolved).
	KVCacheDtype string `json:"kv_cache_dtype"`
	DtypeBytes   int    `json:"dtype_bytes"`
	TP           int    `json:"tp"`
	BlockTokens  int    `json:"block_tokens"`
	// BytesPerToken is one token's KV cache on all workers together.
	BytesPerToken int64 `json:"bytes_per_token"`
	// WorkerBytesPerBlock is one worker's share of one block: every
	// layer's page (vLLM's worker_kv_bytes_per_block × blocks per chunk).
	WorkerBytesPerBlock int64 `json:"worker_bytes_per_block"`
	// BlockBytes is one kvtier slot: TP × WorkerBytesPerBlock, the least
	// --block-bytes kvtierd must have.
	BlockBytes int64 `json:"block_bytes"`
	PoolBytes  int64 `json:"pool_bytes"`
	// PoolBlocks is PoolBytes / BlockBytes: kvtierd's slots.
	PoolBlocks int64 `json:"pool_blocks"`
	PoolTokens int64 `json:"pool_tokens"`
}

// maxSlots is the most slots kvtierd accepts (config.Validate).
const maxSlots = 1<<31 - 1

// Size computes one block's bytes for o.
//
// Per worker and block, an attention layer holds K and V of its KV heads,
// layers × 2 × kv_heads_per_worker × head_dim × tokens × dtype bytes
// (FullAttentionSpec.page_size_bytes); an MLA layer one latent,
// layers × head_dim × tokens × dtype bytes (MLAAttentionSpec's, whose
// head_size_v is 0), the same on every worker. A kvtier slot holds one
// block of every worker.
func (m Model) Size(o Options) (Size, error) {
	o.TP = cmp.Or(o.TP, 1)
	o.BlockTokens = cmp.Or(o.BlockTokens, DefaultBlockTokens)
	o.PoolBytes = cmp.Or(o.PoolBytes, DefaultPoolBytes)
	if err := m.check(o); err != nil {
		return Size{}, err
	}
	dtype, dtypeBytes, err := m.kvDtype(o.KVCacheDtype)
	if err != nil {
		return Size{}, err
	}
	s := Size{
		ModelType: m.ModelType, Attention: m.Attention, Layers: m.Layers,
		KVHeads: m.KVHeads, KVHeadsPerWorker: max(1, m.KVHeads/o.TP), HeadDim: m.HeadDim,
		KVCacheDtype: dtype, DtypeBytes: dtypeBytes, TP: o.TP, BlockTokens: o.BlockTokens,
		PoolBytes: o.PoolBytes,
	}
	kv := int64(2) // K and V
	if m.Attention == MLA {
		kv, s.KVHeadsPerWorker = 1, 1
	}
	var p product
	workerToken := p.mul(int64(s.Layers), kv, int64(s.KVHeadsPerWorker), int64(s.HeadDim), int64(dtypeBytes))
	s.BytesPerToken = p.mul(workerToken, int64(o.TP))
	s.WorkerBytesPerBlock = p.mul(workerToken, int64(o.BlockTokens))
	s.BlockBytes = p.mul(s.WorkerBytesPerBlock, int64(o.TP))
	if p.overflow {
		return Size{}, fmt.Errorf("%w: one block of %d tokens on %d workers is too large to count", ErrBadOption, o.BlockTokens, o.TP)
	}
	s.PoolBlocks = s.PoolBytes / s.BlockBytes
	s.PoolTokens = s.PoolBlocks * int64(o.BlockTokens)
	switch {
	case s.PoolBlocks == 0:
		return Size{}, fmt.Errorf("%w: a pool of %d bytes holds no block of %d bytes (kvtierd refuses it); raise --pool-bytes",
			ErrBadOption, s.PoolBytes, s.BlockBytes)
	case s.PoolBlocks > maxSlots:
		return Size{}, fmt.Errorf("%w: a pool of %d bytes is %d blocks of %d bytes, more than kvtierd's %d slots",
			ErrBadOption, s.PoolBytes, s.PoolBlocks, s.BlockBytes, maxSlots)
	}
	return s, nil
}

// check refuses settings vLLM or kvtierd would refuse.
func (m Model) check(o Options) error {
	switch {
	case m.Layers <= 0 || m.KVHeads <= 0 || m.HeadDim <= 0:
		return fmt.Errorf("%w: a model of %d layers, %d KV heads of %d has no KV cache to size",
			ErrBadField, m.Layers, m.KVHeads, m.HeadDim)
	case o.TP < 0:
		return fmt.Errorf("%w: tensor-parallel size %d", ErrBadOption, o.TP)
	case m.AttentionHeads%o.TP != 0:
		// vLLM's ModelConfig.verify_with_parallel_config.
		return fmt.Errorf("%w: tensor-parallel size %d does not divide the model's %d attention heads (vLLM refuses it)",
			ErrBadOption, o.TP, m.AttentionHeads)
	case o.BlockTokens < 0:
		return fmt.Errorf("%w: block size %d tokens", ErrBadOption, o.BlockTokens)
	case o.PoolBytes < 0:
		return fmt.Errorf("%w: pool size %d bytes", ErrBadOption, o.PoolBytes)
	}
	return nil
}

// dtypeBytes are the KV-cache dtypes stored one element per value, and
// their sizes (vLLM's STR_DTYPE_TO_TORCH_DTYPE).
var dtypeBytes = map[string]int{
	"float32": 4, "float": 4,
	"bfloat16": 2, "float16": 2, "half": 2,
	"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1,
}

// kvDtype resolves a --kv-cache-dtype: "auto" (or "") is the dtype vLLM
// runs the model in, which is the config's, except that vLLM's --dtype
// auto runs a float32 model in 16 bits (vllm/config/model.py,
// _resolve_auto_dtype: "Downcast for float32 models"). To size a model
// served with --dtype float32, pass float32.
func (m Model) kvDtype(name string) (string, int, error) {
	name = strings.ToLower(name)
	if name == "" || name == "auto" {
		if m.Dtype == "" {
			return "", 0, &FieldError{Field: "torch_dtype", Err: ErrMissingField,
				Why: "absent (vLLM would read the weights' dtype): pass --kv-cache-dtype"}
		}
		name = strings.TrimPrefix(strings.ToLower(m.Dtype), "torch.")
		if _, ok := dtypeBytes[name]; !ok {
			return "", 0, fmt.Errorf("%w: the config's dtype %q: pass --kv-cache-dtype", ErrBadDtype, m.Dtype)
		}
		if name == "float32" || name == "float" {
			name = "bfloat16"
		}
	}
	b, ok := dtypeBytes[name]
	if !ok {
		return "", 0, fmt.Errorf("%w: %q: want auto, bfloat16, float16, float32 or fp8 (fp8_e4m3, fp8_e5m2, fp8_inc); "+
			"packed formats with scales (fp8_ds_mla, nvfp4, int8/fp8 per token head, turboquant) are not sized",
			ErrBadDtype, name)
	}
	return name, b, nil
}

// product multiplies int64s, remembering an overflow.
type product struct{ overflow bool }

func (p *product) mul(xs ...int64) int64 {
	r := int64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(uint64(r), uint64(x))
		if hi != 0 || lo > math.MaxInt64 {
			p.overflow = true
			return 0
		}
		r = int64(lo)
	}
	return r
}
