package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

// TestEnvKeysAreUnique: no two keys spell the same variable, the nested
// sections are walked, and fields with no yaml key are not variables.
func TestEnvKeysAreUnique(t *testing.T) {
	keys := envKeyList()
	require.Len(t, envKeyMap(), len(keys), "two keys spell one variable")
	have := map[string]string{}
	var refused []string
	for _, k := range keys {
		have[k.env] = k.key
		if k.unsupported != "" {
			refused = append(refused, k.key)
		}
	}
	for env, key := range map[string]string{
		"KVTIER_POOL_BYTES":                "pool_bytes",
		"KVTIER_ENGINE_LISTEN":             "engine_listen",
		"KVTIER_EVENTS_ENDPOINT":           "events.endpoint",
		"KVTIER_EVENTS_KV_CACHE_SPEC_KIND": "events.kv_cache_spec_kind",
		"KVTIER_PEERS_LISTEN":              "peers.listen",
		"KVTIER_PEERS_NODE_ID":             "peers.node_id",
		"KVTIER_PEERS_DISCOVERY_ENDPOINTS": "peers.discovery.endpoints",
		"KVTIER_PEERS_TLS_CA":              "peers.tls.ca",
		"KVTIER_PEERS_NIXL_LIBRARY":        "peers.nixl.library",
	} {
		require.Equal(t, key, have[env], env)
	}
	for _, env := range []string{"KVTIER_CLOCK", "KVTIER_LOGGER", "KVTIER_FAULTS", "KVTIER_ENGINE_CLOCK", "KVTIER_PEERS_TRANSPORT_IMPL"} {
		require.NotContains(t, have, env, "yaml:\"-\" fields are not config keys")
	}
	require.ElementsMatch(t, []string{"secondary_tiers", "peers.static", "peers.nixl.backend_params"}, refused)
}

// TestEnvParsesAsTheFileDoes: every key the environment can set, given a
// value of its type, yields the Config the same value in a YAML file
// yields (so a key added to Config is settable with no code), and a bad
// value is refused by both.
func TestEnvParsesAsTheFileDoes(t *testing.T) {
	for _, k := range envKeyList() {
		if k.unsupported != "" {
			continue
		}
		ft := reflect.TypeFor[Config]().FieldByIndex(k.index).Type
		good, goodYAML, bad := sampleValues(k.name, ft)
		t.Run(k.env, func(t *testing.T) {
			fromFile, err := ParseConfig([]byte(nested(k.key, goodYAML)))
			require.NoError(t, err)
			var fromEnv Config
			require.NoError(t, FromEnv([]string{k.env + "=" + good}, &fromEnv))
			require.Equal(t, fromFile, fromEnv)
			require.NotEqual(t, Config{}, fromEnv, "the variable set nothing")
			if bad == "" {
				return
			}
			_, fileErr := ParseConfig([]byte(nested(k.key, bad)))
			require.ErrorIs(t, fileErr, messages.ErrBadConfig, "the file takes %q", bad)
			err = FromEnv([]string{k.env + "=" + bad}, &fromEnv)
			require.ErrorIs(t, err, messages.ErrBadConfig)
			require.ErrorContains(t, err, k.env)
			require.Equal(t, fromFile, fromEnv, "a bad value leaves the config as it was")
		})
	}
}

// sampleValues are a good value of a key of type ft, for the environment
// and for YAML, and a bad one ("" where every string is good).
func sampleValues(name string, ft reflect.Type) (env, yamlValue, bad string) {
	switch {
	case ft == durationType:
		return "1500ms", "1500ms", "30"
	case strings.HasSuffix(name, "_bytes"):
		return "16MiB", "16MiB", "lots"
	case ft.Kind() == reflect.Slice:
		return " tcp://a:1, ,tcp://b:2", "[tcp://a:1, tcp://b:2]", ""
	case ft.Kind() == reflect.Bool:
		return "true", "true", "maybe"
	case ft.Kind() == reflect.String:
		return "v-1", "v-1", ""
	case ft.Kind() == reflect.Float32 || ft.Kind() == reflect.Float64:
		return "2.5", "2.5", "x"
	}
	return "3", "3", "x"
}

// nested is a YAML document setting the dotted key to value.
func nested(key, value string) string {
	var b strings.Builder
	parts := strings.Split(key, ".")
	for i, p := range parts {
		b.WriteString(strings.Repeat("  ", i) + p + ":")
		if i == len(parts)-1 {
			b.WriteString(" " + value)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestFromEnv(t *testing.T) {
	file := "pool_path: /dev/shm/file.pool\npool_bytes: 1GiB\npolicy: arc\nlease_ttl: 7s\n" +
		"events:\n  endpoint: tcp://*:5557\n  learn_from: [tcp://x:1]\n" +
		"peers:\n  node_id: a\n  listen: tcp://127.0.0.1:7600\n  secret: file-secret-0123456789\n"
	for _, tc := range []struct {
		name    string
		environ []string
		want    func(c *Config) // the file's Config, changed as the environment says
		errs    []string        // each in the error; none: no error
	}{
		{
			name:    "no variables: the file's values",
			environ: []string{"PATH=/bin", "HOME=/root"},
			want:    func(*Config) {},
		},
		{
			name: "variables override the file, others keep it",
			environ: []string{"KVTIER_POOL_BYTES=16GiB", "KVTIER_LEASE_TTL=1m30s", "KVTIER_EVENTS_ENDPOINT=ipc:///run/ev",
				"KVTIER_ENGINE_ALLOW_REMOTE=true", "KVTIER_JOB_WORKERS=4", "KVTIER_PEERS_DISCOVERY_ENDPOINTS=http://e1:2379,http://e2:2379"},
			want: func(c *Config) {
				c.PoolBytes, c.LeaseTTL, c.Events.Endpoint = 16<<30, 90*time.Second, "ipc:///run/ev"
				c.EngineAllowRemote, c.JobWorkers = true, 4
				c.Peers.Discovery.Endpoints = []string{"http://e1:2379", "http://e2:2379"}
			},
		},
		{
			name:    "an empty variable is unset",
			environ: []string{"KVTIER_POLICY=", "KVTIER_POOL_PATH="},
			want:    func(*Config) {},
		},
		{
			name:    "a list replaces the file's; items trimmed, empty ones dropped",
			environ: []string{"KVTIER_EVENTS_LEARN_FROM= tcp://a:1, ,tcp://b:2,"},
			want:    func(c *Config) { c.Events.LearnFrom = []string{"tcp://a:1", "tcp://b:2"} },
		},
		{
			name:    "strings are verbatim",
			environ: []string{"KVTIER_NAMESPACE=~", "KVTIER_EVENTS_TOPIC=true", "KVTIER_EVENTS_MODEL= m # x"},
			want:    func(c *Config) { c.Namespace, c.Events.Topic, c.Events.Model = "~", "true", " m # x" },
		},
		{
			name:    "a variable given twice: the first",
			environ: []string{"KVTIER_POLICY=lru", "KVTIER_POLICY=prefix"},
			want:    func(c *Config) { c.Policy = "lru" },
		},
		{
			name:    "secret_file from the environment replaces the file's secret",
			environ: []string{"KVTIER_PEERS_SECRET_FILE=/etc/kvtier/peer.key"},
			want:    func(c *Config) { c.Peers.Secret, c.Peers.SecretFile = "", "/etc/kvtier/peer.key" },
		},
		{
			name:    "not config keys: other tools' variables, the address, kvtierd's own",
			environ: []string{"KVTIER_ADDRESS=unix:///x.sock", "KVTIERD_CPUPROFILE=/tmp/p", "kvtier_pool_bytes=1", "KVTIER_NAMESPACE_SALT=s"},
			want:    func(*Config) {},
		},
		{
			name:    "a bad value names its variable and changes nothing",
			environ: []string{"KVTIER_POOL_BYTES=lots", "KVTIER_LEASE_TTL=30"},
			errs:    []string{"KVTIER_POOL_BYTES (pool_bytes)", "lots", "KVTIER_LEASE_TTL (lease_ttl)", "needs a unit"},
		},
		{
			name:    "a mistyped key",
			environ: []string{"KVTIER_POOL_BYTE=1GiB"},
			errs:    []string{"unknown environment variable KVTIER_POOL_BYTE", "did you mean KVTIER_POOL_BYTES?"},
		},
		{
			name:    "a misremembered key of a known family",
			environ: []string{"KVTIER_ENGINE_SOCKET=unix:///x", "KVTIER_PEERS_PORT=7600"},
			errs:    []string{"KVTIER_ENGINE_SOCKET", "KVTIER_PEERS_PORT"},
		},
		{
			name:    "a section's name, singular",
			environ: []string{"KVTIER_PEER_LISTEN=tcp://0.0.0.0:7600"},
			errs:    []string{"KVTIER_PEER_LISTEN", "did you mean KVTIER_PEERS_LISTEN?"},
		},
		{
			name:    "keys one variable cannot hold",
			environ: []string{"KVTIER_SECONDARY_TIERS=fs", "KVTIER_PEERS_STATIC=b=tcp://h:1", "KVTIER_PEERS_NIXL_BACKEND_PARAMS=a"},
			errs:    []string{"KVTIER_SECONDARY_TIERS: secondary_tiers is a list of mappings", "config file", "KVTIER_PEERS_STATIC", "KVTIER_PEERS_NIXL_BACKEND_PARAMS: peers.nixl.backend_params is a mapping"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(file))
			require.NoError(t, err)
			want, err := ParseConfig([]byte(file))
			require.NoError(t, err)
			err = FromEnv(tc.environ, &cfg)
			if len(tc.errs) > 0 {
				require.ErrorIs(t, err, messages.ErrBadConfig)
				for _, s := range tc.errs {
					require.ErrorContains(t, err, s)
				}
				require.Equal(t, want, cfg, "a refused variable changes nothing")
				return
			}
			require.NoError(t, err)
			tc.want(&want)
			require.Equal(t, want, cfg)
		})
	}
}

// TestFromEnvIgnoresOtherToolsVariables: the KVTIER_ variables this
// repository's scripts, benches and tests set for themselves (they reach
// kvtierd through its environment) are not mistaken for mistyped keys.
func TestFromEnvIgnoresOtherToolsVariables(t *testing.T) {
	var environ []string
	for _, name := range []string{
		"NIXL_LIB", "NIXL_VERSION", "NIXL_PACKAGE", "NIXL_KVN_H", "NIXL_CACHE", "VLLM_VENV", "VLLM_TESTS",
		"SGLANG_VENV", "SGLANG_GPU_VENV", "GPU_CACHE", "GPU_TESTS", "GPU_TESTS_TIMEOUT", "BENCH_DEBUG",
		"BENCH_TEST_CHILD", "BENCH_IDLE_CHILD", "GO_TOOLCHAIN_SUM", "WRITE_CORPUS", "SEED", "SEQS",
		"HARNESS_STEP_TIME", "HARNESS_KVTIERD", "PROC_HELPER", "LONG_RUN_REQUESTS", "TEST_LOG", "TEST_DEBUG",
	} {
		environ = append(environ, EnvPrefix+name+"=1")
	}
	var cfg Config
	require.NoError(t, FromEnv(environ, &cfg))
	require.Equal(t, Config{}, cfg)
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"POLICY", "POLICY", 0}, {"POLICY", "POLICYY", 1}, {"PEER_LISTEN", "PEERS_LISTEN", 1},
		{"POOL_BYTES", "POOL_BYTE", 1}, {"ab", "ba", 2}, {"", "abc", 3}, {"kitten", "sitting", 3},
	} {
		require.Equal(t, tc.want, editDistance(tc.a, tc.b), fmt.Sprintf("%q %q", tc.a, tc.b))
		require.Equal(t, tc.want, editDistance(tc.b, tc.a), fmt.Sprintf("%q %q", tc.b, tc.a))
	}
}
