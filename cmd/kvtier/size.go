package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/tools/kvsize"
)

// newSizeCmd builds `kvtier size`: how large kvtierd's slots must be for a
// model, and what a pool holds, from the model's config.json
// (tools/kvsize).
func newSizeCmd() *cobra.Command {
	var (
		model  string
		o      = kvsize.Options{TP: 1, BlockTokens: kvsize.DefaultBlockTokens, KVCacheDtype: "auto"}
		pool   = config.ByteSize(kvsize.DefaultPoolBytes)
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "size --model CONFIG.json",
		Short: "kvtierd's --block-bytes for a model: one offloaded block of every tensor-parallel worker, from its config.json",
		Long: `Computes, from a Hugging Face config.json, the bytes of one offloaded block
of KV cache as vLLM lays it out, for every tensor-parallel worker together
(what one kvtierd slot holds, so the least --block-bytes), and how many
blocks and tokens a pool of --pool-bytes holds.

--block-size is the tokens of one offloaded block: the connector's
block_size where it sets one, else vLLM's --block-size (a multiple of the
engine's GPU block size; MLA backends such as FlashMLA use 64).`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if model == "" {
				return fmt.Errorf("size: --model CONFIG.json is required")
			}
			data, err := os.ReadFile(model)
			if err != nil {
				return fmt.Errorf("size: %w", err)
			}
			m, err := kvsize.Parse(data)
			if err != nil {
				return fmt.Errorf("size: %s: %w", model, err)
			}
			if o.TP <= 0 || o.BlockTokens <= 0 || pool <= 0 {
				return fmt.Errorf("size: %w: --tp, --block-size and --pool-bytes must be positive", kvsize.ErrBadOption)
			}
			o.PoolBytes = int64(pool)
			s, err := m.Size(o)
			if err != nil {
				return fmt.Errorf("size: %s: %w", model, err)
			}
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(s)
			}
			return s.WriteText(os.Stdout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", "", "the model's Hugging Face config.json")
	f.IntVar(&o.TP, "tp", o.TP, "tensor-parallel size (vLLM's --tensor-parallel-size)")
	f.IntVar(&o.BlockTokens, "block-size", o.BlockTokens, "tokens per offloaded block (the connector's block_size, else vLLM's --block-size)")
	f.StringVar(&o.KVCacheDtype, "kv-cache-dtype", o.KVCacheDtype,
		"vLLM's --kv-cache-dtype: auto (the model's dtype; float32 models run in 16 bits), bfloat16, float16, float32, fp8, fp8_e4m3, fp8_e5m2, fp8_inc")
	f.Var(sizeFlag{&pool}, "pool-bytes", "kvtierd's pool size, e.g. 64GiB")
	f.BoolVar(&asJSON, "json", false, "print one JSON object, sizes in bytes")
	return cmd
}

// sizeFlag is a config.ByteSize ("64GiB") as a cobra flag, which must name
// its type.
type sizeFlag struct{ *config.ByteSize }

func (sizeFlag) Type() string { return "size" }
