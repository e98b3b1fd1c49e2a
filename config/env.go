package config

// A Config from the environment: every key of the YAML file may be given as
// KVTIER_<KEY>, the key upper-cased with a nested section's keys joined by
// "_": pool_bytes is KVTIER_POOL_BYTES, events.endpoint
// KVTIER_EVENTS_ENDPOINT, peers.discovery.endpoints
// KVTIER_PEERS_DISCOVERY_ENDPOINTS. The keys are found by walking Config's
// yaml tags, so a key added to Config is settable here with no code.
//
// Values parse as the file's do (decodeField): sizes ("_bytes" keys) take
// an integer or a human size ("16GiB"), durations a Go duration ("30s") or
// 0, bools and numbers as YAML reads them. Strings are taken verbatim (no
// YAML quoting: "~" is a tilde, not null). A list of plain values is
// comma-separated, spaces around items trimmed, empty items dropped
// (KVTIER_EVENTS_LEARN_FROM=tcp://a:5557,tcp://b:5557). An empty variable
// counts as unset, as a unit file's unset ${VAR} expands to one.
//
// Keys that make no sense as one string are refused with an error naming
// them: lists of mappings (secondary_tiers, peers.static: use the file, or
// kvtierd's --peer) and mappings (peers.nixl.backend_params).
//
// An unknown KVTIER_ variable is an error when it looks like a mistyped
// key: it starts with the first word of a key of two or more words (POOL_,
// ENGINE_, EVENTS_, PEERS_, ...; the family of a misremembered name), or it
// is within two edits of a key (KVTIER_POLICYY, KVTIER_PEER_LISTEN). Any
// other KVTIER_ variable belongs to some other tool and is ignored, as are
// KVTIER_ADDRESS (EnvAddress, the default engine address) and KVTIERD_*
// (kvtierd's own, e.g. KVTIERD_CPUPROFILE).

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// EnvPrefix starts every config key's environment variable.
const EnvPrefix = "KVTIER_"

// FromEnv overlays on cfg the config keys environ (os.Environ's form,
// NAME=VALUE) sets, and reports every bad or unknown-but-key-like variable
// at once, each wrapping messages.ErrBadConfig. Keys the environment does
// not set keep cfg's values; it validates nothing else (Validate does,
// once every source is applied). A variable given twice counts once, the
// first, as os.Getenv reads it.
//
// As on kvtierd's command line, peers.secret and peers.secret_file exclude
// each other across sources: the one the environment sets clears cfg's
// other, unless the environment sets both.
func FromEnv(environ []string, cfg *Config) error {
	vars := map[string]string{}
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) || name == EnvAddress {
			continue
		}
		if _, dup := vars[name]; !dup {
			vars[name] = value
		}
	}
	keys := envKeyMap()
	var errs []error
	set := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(vars)) {
		value := vars[name]
		if value == "" {
			continue
		}
		k, ok := keys[name]
		switch {
		case !ok:
			if near, looks := lookalike(name); looks {
				errs = append(errs, badConfig("unknown environment variable %s: no config key spells it (did you mean %s?)", name, near))
			}
			continue
		case k.unsupported != "":
			errs = append(errs, badConfig("%s: %s is %s, which one environment variable cannot hold; set it in the config file",
				name, k.key, k.unsupported))
			continue
		}
		if err := k.set(cfg, value); err != nil {
			errs = append(errs, err)
			continue
		}
		set[k.key] = true
	}
	switch {
	case set["peers.secret_file"] && !set["peers.secret"]:
		cfg.Peers.Secret = ""
	case set["peers.secret"] && !set["peers.secret_file"]:
		cfg.Peers.SecretFile = ""
	}
	return errors.Join(errs...)
}

// envKey is one config key as an environment variable.
type envKey struct {
	env   string // KVTIER_PEERS_DISCOVERY_ENDPOINTS
	key   string // peers.discovery.endpoints, as the file nests it
	name  string // endpoints: the key within its section (decodeField's key)
	index []int  // the field, from Config (reflect.Value.FieldByIndex)
	// unsupported says what the key's value is when one variable cannot
	// hold it ("a list of mappings"); "" when FromEnv sets it.
	unsupported string
}

// envKeyList is every key of Config, in field order.
var envKeyList = sync.OnceValue(func() []envKey {
	var out []envKey
	walkEnvKeys(reflect.TypeFor[Config](), nil, nil, &out)
	return out
})

// envKeyMap is envKeyList by variable name. NB: two keys that spell the same
// variable (a top-level "peers_x" beside peers.x) would shadow one another;
// TestEnvKeysAreUnique keeps that from shipping.
var envKeyMap = sync.OnceValue(func() map[string]envKey {
	m := map[string]envKey{}
	for _, k := range envKeyList() {
		if _, dup := m[k.env]; !dup {
			m[k.env] = k
		}
	}
	return m
})

// walkEnvKeys appends the keys of struct type t, under the section path
// and field index given; sections (nested structs) are walked.
func walkEnvKeys(t reflect.Type, path []string, index []int, out *[]envKey) {
	byName := yamlFields(t)
	names := slices.SortedFunc(maps.Keys(byName), func(a, b string) int { return byName[a] - byName[b] })
	for _, name := range names {
		i := byName[name]
		ft := t.Field(i).Type
		// NB: clipped, so that siblings never share a backing array.
		p, idx := append(slices.Clip(path), name), append(slices.Clip(index), i)
		if ft.Kind() == reflect.Struct {
			walkEnvKeys(ft, p, idx, out)
			continue
		}
		k := envKey{
			env:   EnvPrefix + strings.ToUpper(strings.Join(p, "_")),
			key:   strings.Join(p, "."),
			name:  name,
			index: idx,
		}
		switch {
		case ft.Kind() == reflect.Slice && plainKind(ft.Elem().Kind()):
		case ft.Kind() == reflect.Slice:
			k.unsupported = "a list of mappings"
		case ft.Kind() == reflect.Map:
			k.unsupported = "a mapping"
		case !plainKind(ft.Kind()):
			k.unsupported = "not a plain value"
		}
		*out = append(*out, k)
	}
}

// plainKind: a value one string spells (a YAML scalar).
func plainKind(k reflect.Kind) bool {
	switch k {
	case reflect.Bool, reflect.String,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

// set parses value into k's field of cfg; an error names the variable.
func (k envKey) set(cfg *Config, value string) error {
	f := reflect.ValueOf(cfg).Elem().FieldByIndex(k.index)
	v := scalarNode(value, f.Type())
	if f.Kind() == reflect.Slice {
		v = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, item := range strings.Split(value, ",") {
			if item = strings.TrimSpace(item); item != "" {
				v.Content = append(v.Content, scalarNode(item, f.Type().Elem()))
			}
		}
	}
	// Decode into a zero value first: a failed decode leaves cfg as it was.
	tmp := reflect.New(f.Type()).Elem()
	if err := decodeEnvValue(k.name, v, tmp); err != nil {
		return badConfig("%s (%s): %v", k.env, k.key, err)
	}
	f.Set(tmp)
	return nil
}

// scalarNode is value as the YAML node a file's plain scalar would be, for
// a field of type t: tagged as YAML resolves it (30s a string, 0 an int,
// true a bool), except that a string field's value is always a string.
func scalarNode(value string, t reflect.Type) *yaml.Node {
	if t.Kind() == reflect.String {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value}
	}
	n := &yaml.Node{Kind: yaml.ScalarNode, Value: strings.TrimSpace(value)}
	n.Tag = n.ShortTag()
	return n
}

// decodeEnvValue sets f from v as decodeField does for a file's key name,
// without the line numbers an environment variable has none of.
func decodeEnvValue(name string, v *yaml.Node, f reflect.Value) error {
	// NB: the same cases as decodeField, in the same order.
	switch {
	case f.Type() == durationType:
		d, err := parseDurationNode(v)
		if err != nil {
			return err
		}
		f.SetInt(int64(d))
		return nil
	case strings.HasSuffix(name, "_bytes") && f.CanInt():
		n, err := parseSizeNode(v)
		if err != nil {
			return err
		}
		if f.OverflowInt(n) {
			return fmt.Errorf("size %d out of range", n)
		}
		f.SetInt(n)
		return nil
	}
	if err := v.Decode(f.Addr().Interface()); err != nil {
		return flattenYAMLError(err)
	}
	return nil
}

// lookalike reports whether name (a KVTIER_ variable no key spells) looks
// like a mistyped key, and the key variable nearest to it.
func lookalike(name string) (nearest string, looks bool) {
	rest := strings.TrimPrefix(name, EnvPrefix)
	best := -1
	for _, k := range envKeyList() {
		key := strings.TrimPrefix(k.env, EnvPrefix)
		if first, _, multi := strings.Cut(key, "_"); multi && (rest == first || strings.HasPrefix(rest, first+"_")) {
			looks = true
		}
		if d := editDistance(rest, key); best < 0 || d < best {
			best, nearest = d, k.env
		}
	}
	return nearest, looks || best <= 2
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
