package events

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The enumerated settings read their names, "" as the default, and refuse
// anything else as a bad config that names the setting and its choices.
func TestEnumeratedSettingsReadTheirNames(t *testing.T) {
	for s, want := range map[string]HashFormat{"": HashInt, "int": HashInt, "bytes": HashBytes} {
		got, err := ParseHashFormat(s)
		require.NoError(t, err, s)
		assert.Equal(t, want, got, s)
		if s != "" {
			assert.Equal(t, s, got.String(), "a format prints as it is spelled")
		}
	}
	for s, want := range map[string]Encoding{"": EncodingMap, "map": EncodingMap, "array": EncodingArray} {
		got, err := ParseEncoding(s)
		require.NoError(t, err, s)
		assert.Equal(t, want, got, s)
	}
	_, err := ParseHashFormat("hex")
	require.ErrorIs(t, err, ErrBadConfig)
	assert.ErrorContains(t, err, `hash format "hex" (want int or bytes)`)
	_, err = ParseEncoding("json")
	require.ErrorIs(t, err, ErrBadConfig)
	assert.ErrorContains(t, err, `encoding "json" (want map or array)`)
}
