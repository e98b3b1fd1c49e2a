package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/tiers/obj/objtest"
)

func TestRunObjSmall(t *testing.T) {
	objtest.Need(t)
	o := DefaultObjOptions()
	o.Dir, o.Blocks, o.BlockBytes, o.Window, o.Workers, o.Timeout = t.TempDir(), 32, 16<<10, 4, 4, time.Minute
	r, err := RunObj(context.Background(), o)
	require.NoError(t, err)
	for _, v := range []float64{r.ObjPutGBps, r.ObjGetGBps, r.RawPutGBps, r.RawGetGBps} {
		require.Positive(t, v)
	}
}
