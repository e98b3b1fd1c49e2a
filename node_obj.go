package kvtier

import (
	"github.com/rs/zerolog"
)

// openObjTier opens an S3-compatible object tier.
func openObjTier(tc TierConfig, name string, cfg Config, log zerolog.Logger) (openedTier, error) {
	return openedTier{}, badConfig("secondary tier %s: obj tier not built yet", name)
}
