package main

import (
	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/tiers/fs"
)

// tierFlags are the secondary tiers of `kvtier sim`'s embedded node.
type tierFlags struct {
	fsRoot                            string
	fsBlocks                          int
	fsFsync                           bool
	objEndpoint, objBucket, objPrefix string
}

func addTierFlags(f *pflag.FlagSet, t *tierFlags) {
	f.StringVar(&t.fsRoot, "fs-root", "", "add a filesystem secondary tier under DIR (blocks persist there between runs: use a fresh DIR for reproducible counts)")
	f.IntVar(&t.fsBlocks, "fs-blocks", 0, "capacity of the fs tier in blocks (0 = unbounded)")
	f.BoolVar(&t.fsFsync, "fs-fsync", false, "fsync every block file the fs tier writes")
	f.StringVar(&t.objEndpoint, "obj-endpoint", "", "add an S3 object secondary tier at HOST:PORT (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
	f.StringVar(&t.objBucket, "obj-bucket", "kvtier", "bucket of the obj tier")
	f.StringVar(&t.objPrefix, "obj-prefix", "", "key prefix of the obj tier")
}

// apply adds the tiers the flags ask for, fs first.
func (t tierFlags) apply(cfg *kvtier.Config) {
	if t.fsRoot != "" {
		cfg.SecondaryTiers = append(cfg.SecondaryTiers, kvtier.TierConfig{Kind: "fs", Root: t.fsRoot,
			Capacity: kvtier.ByteSize(int64(t.fsBlocks) * int64(cfg.BlockBytes+fs.HeaderSize)), Fsync: t.fsFsync})
	}
	if t.objEndpoint != "" {
		cfg.SecondaryTiers = append(cfg.SecondaryTiers, kvtier.TierConfig{Kind: "obj", Endpoint: t.objEndpoint,
			Bucket: t.objBucket, Prefix: t.objPrefix})
	}
}
