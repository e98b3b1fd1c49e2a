package config

// Loading a Config from a YAML file. The file's keys are Config's yaml tags.
// Decoding is strict: an unknown or repeated key, a value of the wrong type,
// a size or duration without a valid unit are all ErrBadConfig errors that
// name the key and its line. Sizes (fields whose key ends in "_bytes") take
// a plain integer or a human string such as "1GiB" or "256KiB"; durations
// take a Go duration string such as "30s".

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvtier/kvtier/messages"
)

// LoadConfigFile reads and validates the YAML config at path. Keys absent
// from the file stay zero in the result (Open fills in the defaults), so a
// caller can overlay command-line flags before opening a node. The values
// present are validated as Open would validate them.
func LoadConfigFile(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("kvtier: reading config file: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	if err := cfg.WithDefaults().Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes one YAML document into a Config, strictly (see
// LoadConfigFile), without applying defaults or validating ranges. An empty
// document is the zero Config.
func ParseConfig(data []byte) (Config, error) {
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return cfg, nil
		}
		return cfg, badConfig("%v", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return cfg, badConfig("config must be a single YAML document")
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return cfg, nil
	}
	if root.Kind != yaml.MappingNode {
		return cfg, badConfig("line %d: config must be a mapping of keys to values", root.Line)
	}
	return cfg, decodeStrict(root, reflect.ValueOf(&cfg).Elem())
}

// decodeStrict sets the fields of the struct dst from the mapping node m,
// keyed by their yaml tags.
func decodeStrict(m *yaml.Node, dst reflect.Value) error {
	fields := yamlFields(dst.Type())
	seen := make(map[string]bool, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return badConfig("line %d: keys must be plain strings", k.Line)
		}
		idx, ok := fields[k.Value]
		if !ok {
			return badConfig("line %d: unknown key %q", k.Line, k.Value)
		}
		if seen[k.Value] {
			return badConfig("line %d: key %q repeated", k.Line, k.Value)
		}
		seen[k.Value] = true
		if err := decodeField(k.Value, v, dst.Field(idx)); err != nil {
			return err
		}
	}
	return nil
}

// yamlFields maps the yaml keys of struct type t to field indexes; fields
// tagged "-" or unexported are left out.
func yamlFields(t reflect.Type) map[string]int {
	out := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = i
	}
	return out
}

var durationType = reflect.TypeFor[time.Duration]()

// decodeField sets one field from node v; errors name the key and line.
func decodeField(key string, v *yaml.Node, f reflect.Value) error {
	switch {
	case f.Type() == durationType:
		d, err := parseDurationNode(v)
		if err != nil {
			return badConfig("%s (line %d): %v", key, v.Line, err)
		}
		f.SetInt(int64(d))
		return nil
	case strings.HasSuffix(key, "_bytes") && f.CanInt():
		n, err := parseSizeNode(v)
		if err != nil {
			return badConfig("%s (line %d): %v", key, v.Line, err)
		}
		if f.OverflowInt(n) {
			return badConfig("%s (line %d): size %d out of range", key, v.Line, n)
		}
		f.SetInt(n)
		return nil
	}
	// Anything else: yaml's own decoding into the field's type, re-run
	// through a strict decoder so nested structs reject unknown keys too.
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	if err := enc.Encode(v); err != nil {
		return badConfig("%s (line %d): %v", key, v.Line, err)
	}
	if err := enc.Close(); err != nil {
		return badConfig("%s (line %d): %v", key, v.Line, err)
	}
	dec := yaml.NewDecoder(&buf)
	dec.KnownFields(true)
	if err := dec.Decode(f.Addr().Interface()); err != nil {
		return badConfig("%s (line %d): %v", key, v.Line, flattenYAMLError(err))
	}
	return nil
}

// flattenYAMLError puts a yaml.TypeError's lines on one line; its line
// numbers refer to the re-encoded value, so they are dropped.
func flattenYAMLError(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		if _, rest, ok := strings.Cut(m, ": "); ok && strings.HasPrefix(m, "line ") {
			m = rest
		}
		msgs[i] = m
	}
	return errors.New(strings.Join(msgs, "; "))
}

// parseDurationNode accepts a Go duration string ("30s", "1m30s") or the
// integer 0; any other bare number is refused as ambiguous.
func parseDurationNode(v *yaml.Node) (time.Duration, error) {
	if v.Kind != yaml.ScalarNode {
		return 0, fmt.Errorf("want a duration such as \"30s\"")
	}
	if v.Tag == "!!int" && v.Value == "0" {
		return 0, nil
	}
	if v.Tag != "!!str" {
		return 0, fmt.Errorf("duration %q needs a unit, e.g. \"30s\"", v.Value)
	}
	d, err := time.ParseDuration(v.Value)
	if err != nil {
		return 0, fmt.Errorf("bad duration: %w", err)
	}
	return d, nil
}

// parseSizeNode accepts a YAML integer or a human size string.
func parseSizeNode(v *yaml.Node) (int64, error) {
	if v.Kind != yaml.ScalarNode {
		return 0, fmt.Errorf("want a size such as 1073741824 or \"1GiB\"")
	}
	switch v.Tag {
	case "!!int":
		var n int64
		if err := v.Decode(&n); err != nil {
			return 0, fmt.Errorf("bad size: %w", err)
		}
		return n, nil
	case "!!str":
		return ParseByteSize(v.Value)
	}
	return 0, fmt.Errorf("size %q: want an integer or a string such as \"1GiB\"", v.Value)
}

// badConfig wraps messages.ErrBadConfig.
func badConfig(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{messages.ErrBadConfig}, a...)...)
}

// ByteSize is a size in bytes that parses human strings (ParseByteSize). It
// implements flag.Value and yaml.Unmarshaler.
type ByteSize int64

// byteUnits are the accepted suffixes, matched case-insensitively: SI
// (powers of 1000) and IEC (powers of 1024).
var byteUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1e3, "kb": 1e3, "ki": 1 << 10, "kib": 1 << 10,
	"m": 1e6, "mb": 1e6, "mi": 1 << 20, "mib": 1 << 20,
	"g": 1e9, "gb": 1e9, "gi": 1 << 30, "gib": 1 << 30,
	"t": 1e12, "tb": 1e12, "ti": 1 << 40, "tib": 1 << 40,
}

// ParseByteSize parses a size: an integer number of bytes ("65536"), or a
// number with a unit ("256KiB", "1.5GiB", "16 MiB", "2GB"). KiB/MiB/GiB/TiB
// (or Ki/Mi/Gi/Ti) are powers of 1024; K/KB, M/MB, G/GB, T/TB are powers of
// 1000. The result must be a whole number of bytes that fits an int64. A
// leading minus sign is accepted so that range checks report negative sizes
// against the field they belong to.
func ParseByteSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	end := len(t)
	for end > 0 && isUnitLetter(t[end-1]) {
		end--
	}
	num, unit := strings.TrimSpace(t[:end]), strings.ToLower(t[end:])
	mult, ok := byteUnits[unit]
	if !ok || num == "" {
		return 0, fmt.Errorf("bad size %q: want a number with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s)
	}
	if n, err := strconv.ParseInt(num, 10, 64); err == nil {
		if n > math.MaxInt64/mult || n < math.MinInt64/mult {
			return 0, fmt.Errorf("size %q out of range", s)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("bad size %q: %q is not a number", s, num)
	}
	b := f * float64(mult)
	if b != math.Trunc(b) {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", s)
	}
	if b >= math.MaxInt64 || b < math.MinInt64 {
		return 0, fmt.Errorf("size %q out of range", s)
	}
	return int64(b), nil
}

func isUnitLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// Set parses s (flag.Value).
func (b *ByteSize) Set(s string) error {
	n, err := ParseByteSize(s)
	if err != nil {
		return err
	}
	*b = ByteSize(n)
	return nil
}

// String formats b in the largest IEC unit that divides it exactly.
func (b ByteSize) String() string {
	n := int64(b)
	for _, u := range []struct {
		name string
		size int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// UnmarshalYAML accepts an integer or a human size string.
func (b *ByteSize) UnmarshalYAML(v *yaml.Node) error {
	n, err := parseSizeNode(v)
	if err != nil {
		return fmt.Errorf("line %d: %w", v.Line, err)
	}
	*b = ByteSize(n)
	return nil
}
