package discovery

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/testetcd"
)

func TestListReadsEveryMemberSortedAndReportsBadRecords(t *testing.T) {
	s := testetcd.Start(t)
	start(t, s, "b")
	start(t, s, "a")
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	_, err := raw(t, s).Put(ctx, nodeKey(DefaultPrefix, "c"), `{"node_id":"someone-else","control":"tcp://x:1"}`)
	require.NoError(t, err)

	members, bad, err := List(ctx, []string{s.Endpoint()}, "", 0)
	require.NoError(t, err)
	require.Len(t, members, 2)
	require.Equal(t, "a", members[0].Node)
	require.Equal(t, "b", members[1].Node)
	require.Equal(t, 4096, members[0].BlockBytes)
	require.Len(t, bad, 1, "c's record names another node")
	require.ErrorIs(t, bad[nodeKey(DefaultPrefix, "c")], errBadRecord)

	none, _, err := List(ctx, []string{s.Endpoint()}, "/other/", 0)
	require.NoError(t, err)
	require.Empty(t, none, "another prefix is another fleet")
}
