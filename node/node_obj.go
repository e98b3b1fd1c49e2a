package node

import (
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/obj"
)

// openObjTier opens an S3-compatible object tier (tiers/obj). It does no
// network I/O: the tier's actor probes the endpoint when it starts, and an
// endpoint that is down only makes the tier start unhealthy.
func openObjTier(tc config.TierConfig, name string, cfg config.Config, log zerolog.Logger) (openedTier, error) {
	access, secret := tc.Credentials()
	t, err := obj.Open(obj.Config{
		Name: name,
		Endpoint: obj.Endpoint{Endpoint: tc.Endpoint, Bucket: tc.Bucket, Region: tc.Region, Secure: tc.Secure,
			AccessKey: access, SecretKey: secret},
		Prefix:        tc.Prefix,
		MaxBlockBytes: maxTierBlock(cfg), // NB: a block of any geometry the pool can hold
		Workers:       tc.Workers,
		LookupTimeout: cfg.SecondaryLookupDeadline,
		Clock:         cfg.Clock,
		Client:        tc.ObjClient,
		Locality:      tc.Locality,
		Log:           log,
	})
	if err != nil {
		return openedTier{}, err
	}
	return openedTier{name: name, kind: tc.Kind, props: t.Props, close: t.Close}, nil
}

// maxTierBlock bounds the blocks a secondary tier keeps: any geometry's,
// so up to the whole pool (one slot of a geometry as large as the
// budget), within the block format's bound.
func maxTierBlock(cfg config.Config) int {
	return int(min(cfg.PoolBytes, blockfmt.MaxBlockBytes))
}

func (n *Node) maxTierBlock() int { return maxTierBlock(n.cfg) }
