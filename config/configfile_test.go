package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/kvtier/kvtier/internal/testutil/tempfile"
	"github.com/kvtier/kvtier/messages"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := tempfile.Write(t, "kvtierd.yaml", body)
	return p
}

func TestLoadConfigFileGood(t *testing.T) {
	p := writeConfig(t, `
# a full config
pool_path: /dev/shm/kvtier-test.pool
pool_bytes: 1GiB
block_bytes: 262144
policy: arc
lease_ttl: 45s
job_workers: 4
load_job_timeout: 2m
store_job_timeout: 90s
call_timeout: 0
`)
	cfg, err := LoadConfigFile(p)
	require.NoError(t, err)
	require.Equal(t, Config{
		PoolPath:        "/dev/shm/kvtier-test.pool",
		PoolBytes:       1 << 30,
		BlockBytes:      256 << 10,
		Policy:          "arc",
		LeaseTTL:        45 * time.Second,
		JobWorkers:      4,
		LoadJobTimeout:  2 * time.Minute,
		StoreJobTimeout: 90 * time.Second,
	}, cfg)
}

func TestLoadConfigFileEmptyAndPartial(t *testing.T) {
	for _, body := range []string{"", "# only a comment\n", "---\n"} {
		cfg, err := LoadConfigFile(writeConfig(t, body))
		require.NoError(t, err, "body %q", body)
		require.Equal(t, Config{}, cfg)
	}
	cfg, err := LoadConfigFile(writeConfig(t, "block_bytes: 64KiB\n"))
	require.NoError(t, err)
	require.Equal(t, Config{BlockBytes: 64 << 10}, cfg, "absent keys stay zero for Open's defaults")
}

func TestLoadConfigFileExample(t *testing.T) {
	cfg, err := LoadConfigFile(filepath.Join("..", "testdata", "kvtierd.yaml"))
	require.NoError(t, err)
	require.NoError(t, cfg.WithDefaults().Validate())
	require.Positive(t, cfg.PoolBytes)
}

func TestLoadConfigFileBad(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"unknown key", "pool_bytes: 1GiB\npool_bytez: 2\n", `unknown key "pool_bytez"`},
		{"repeated key", "policy: lru\npolicy: arc\n", `key "policy" repeated`},
		{"bad size unit", "pool_bytes: 1GiBB\n", "pool_bytes"},
		{"size not a number", "block_bytes: lots\n", "block_bytes"},
		{"size as list", "block_bytes: [1]\n", "block_bytes"},
		{"fractional bytes", "block_bytes: 1.5B\n", "block_bytes"},
		{"size overflow", "pool_bytes: 9000000TiB\n", "pool_bytes"},
		{"block_bytes overflows int32", "block_bytes: 100000000000000000000\n", "block_bytes"},
		{"negative size", "pool_bytes: -1\n", "pool_bytes -1 must be positive"},
		{"negative human size", "pool_bytes: -1GiB\n", "pool_bytes"},
		{"block larger than pool", "pool_bytes: 64KiB\nblock_bytes: 1MiB\n", "pool_bytes"},
		{"duration without unit", "lease_ttl: 30\n", "lease_ttl"},
		{"bad duration", "lease_ttl: soon\n", "lease_ttl"},
		{"negative duration", "call_timeout: -1s\n", "call_timeout"},
		{"wrong type int", "job_workers: many\n", "job_workers"},
		{"engine_poll past its bound", "engine_poll: 20ms\n", "engine_poll 20ms"},
		{"negative engine_poll", "engine_poll: -1us\n", "engine_poll -1µs"},
		{"bad policy", "policy: fifo\n", "policy"},
		{"not a mapping", "- pool_bytes: 1\n", "mapping"},
		{"two documents", "policy: lru\n---\npolicy: arc\n", "single YAML document"},
		{"syntax", "pool_bytes: [\n", "kvtier: bad config"},
		{"yaml-only field", "clock: x\n", `unknown key "clock"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeConfig(t, tc.body)
			_, err := LoadConfigFile(p)
			require.Error(t, err)
			require.ErrorIs(t, err, messages.ErrBadConfig)
			require.Contains(t, err.Error(), tc.want)
			require.Contains(t, err.Error(), p, "error names the file")
		})
	}
}

func TestLoadConfigFileMissing(t *testing.T) {
	_, err := LoadConfigFile(filepath.Join(t.TempDir(), "nope.yaml"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// Every yaml key of Config is accepted, so a field added to Config is
// loadable from a file without touching the loader.
func TestParseConfigCoversEveryField(t *testing.T) {
	ct := reflect.TypeFor[Config]()
	for i := range ct.NumField() {
		f := ct.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "-" || !f.IsExported() {
			continue
		}
		var val string
		switch {
		case f.Type == durationType:
			val = "1s"
		case strings.HasSuffix(tag, "_bytes"):
			val = "1KiB"
		case f.Type.Kind() == reflect.String:
			val = "x"
		case f.Type.Kind() >= reflect.Int && f.Type.Kind() <= reflect.Uint64:
			val = "1"
		case f.Type.Kind() == reflect.Bool:
			val = "true"
		default:
			continue // composite: covered by its own tests when it exists
		}
		cfg, err := ParseConfig([]byte(tag + ": " + val + "\n"))
		require.NoError(t, err, "field %s", f.Name)
		require.False(t, reflect.ValueOf(cfg).Field(i).IsZero(), "field %s not set from key %s", f.Name, tag)
	}
}

func TestParseByteSize(t *testing.T) {
	good := map[string]int64{
		"0": 0, "65536": 65536, "1B": 1, "256KiB": 256 << 10, "256kib": 256 << 10,
		"16 MiB": 16 << 20, "1GiB": 1 << 30, "1Gi": 1 << 30, "2TiB": 2 << 40,
		"1.5GiB": 3 << 29, "2GB": 2e9, "2G": 2e9, "10k": 1e4, "  8MB ": 8e6, "-1KiB": -1024,
	}
	for s, want := range good {
		got, err := ParseByteSize(s)
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "GiB", "1XB", "1.1B", "abc", "1 2 KiB", "NaN", "Inf", "9999999999TiB", "1e30"} {
		_, err := ParseByteSize(s)
		require.Error(t, err, s)
	}
}

func TestByteSizeFlagAndYAML(t *testing.T) {
	var b ByteSize
	require.NoError(t, b.Set("64KiB"))
	require.Equal(t, ByteSize(64<<10), b)
	require.Equal(t, "64KiB", b.String())
	require.Equal(t, "1000", ByteSize(1000).String())
	require.Equal(t, "0", ByteSize(0).String())
	require.Error(t, b.Set("64 parsecs"))

	var doc struct {
		A ByteSize `yaml:"a"`
		B ByteSize `yaml:"b"`
	}
	require.NoError(t, yaml.Unmarshal([]byte("a: 1MiB\nb: 4096\n"), &doc))
	require.Equal(t, ByteSize(1<<20), doc.A)
	require.Equal(t, ByteSize(4096), doc.B)
	require.Error(t, yaml.Unmarshal([]byte("a: huge\n"), &doc))
}
