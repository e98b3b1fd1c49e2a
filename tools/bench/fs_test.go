package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/tiers/fs"
)

// The fs scenario runs its interleaved rounds on both layouts and reports
// every figure, and removes what it wrote.
func TestRunFSSmall(t *testing.T) {
	for _, layout := range []string{fs.LayoutFiles, fs.LayoutSegments} {
		t.Run(layout, func(t *testing.T) {
			o := DefaultFSOptions()
			o.Dir, o.Blocks, o.BlockBytes, o.Window, o.Rounds, o.Layout, o.Timeout = t.TempDir(), 64, 16<<10, 4, 3, layout, time.Minute
			r, err := RunFS(context.Background(), o)
			require.NoError(t, err)
			require.Equal(t, 3, r.Rounds)
			for _, v := range []float64{r.FSWriteGBps, r.FSReadGBps, r.RawWriteGBps, r.RawReadGBps, r.RawFilesWriteGBps, r.WriteRatio, r.ReadRatio} {
				require.Positive(t, v)
			}
			left, err := os.ReadDir(o.Dir)
			require.NoError(t, err)
			require.Empty(t, left, "the scenario's directory is removed")
		})
	}
}
