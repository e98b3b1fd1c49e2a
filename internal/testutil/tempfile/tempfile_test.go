package tempfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteGivesEachFileItsOwnDirectoryOwnerOnly(t *testing.T) {
	a, b := Write(t, "c.yaml", "pool_bytes: 1GiB\n"), Write(t, "c.yaml", "")
	require.NotEqual(t, filepath.Dir(a), filepath.Dir(b), "one directory per file")
	require.Equal(t, "c.yaml", filepath.Base(a))
	data, err := os.ReadFile(a)
	require.NoError(t, err)
	require.Equal(t, "pool_bytes: 1GiB\n", string(data))
	info, err := os.Stat(a)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
}
