package supervision

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRulesKeepOrderAndRemoveOne(t *testing.T) {
	var rules Rules[string]
	require.Empty(t, rules.Active())
	removeA := rules.Inject("a")
	rules.Inject("b")
	removeC := rules.Inject("c")
	require.Equal(t, []string{"a", "b", "c"}, rules.Active())
	removeA()
	removeA() // a second call removes nothing else
	require.Equal(t, []string{"b", "c"}, rules.Active())
	removeC()
	require.Equal(t, []string{"b"}, rules.Active())
}
