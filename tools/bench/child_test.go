package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// A protocol of two requests and a child that answers only the first, to
// test the children's protocol through a real process (this test binary
// run again with KVTIER_BENCH_TEST_CHILD set).
type (
	testRequest  = requestOf[testProtocol]
	testReq      = request[testProtocol]
	testProtocol struct{}
)

type (
	testAdd struct {
		testReq
		A, B int
	}
	testMul struct {
		testReq
		A, B int
	}
	testOff struct{ testReq } // not registered
)

type testReply struct {
	Pid int `json:"pid"`
	Sum int `json:"sum"`
}

var testRequests = newRequestTypes[testRequest](testAdd{}, testMul{})

func init() {
	if os.Getenv("KVTIER_BENCH_TEST_CHILD") == "1" {
		err := serveChild(os.Stdin, os.Stdout, testRequests, testReply{Pid: os.Getpid()}, func(q testRequest) (testReply, error) {
			if a, ok := q.(testAdd); ok {
				return testReply{Sum: a.A + a.B}, nil
			}
			return testReply{}, fmt.Errorf("no %T here", q)
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

func startTestChild(t *testing.T) *childProc[testRequest, testReply] {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "KVTIER_BENCH_TEST_CHILD=1")
	c, err := startChild[testRequest, testReply]("test child", testRequests, cmd)
	require.NoError(t, err)
	return c
}

func TestChildAnswersTypedRequestsInOrder(t *testing.T) {
	c := startTestChild(t)
	require.Equal(t, c.pid(), c.ready.Pid, "the announcement is the first line")
	require.NotNil(t, c.cmd.SysProcAttr, "the child dies with its parent")

	r, err := c.call(testAdd{A: 2, B: 3})
	require.NoError(t, err)
	require.Equal(t, 5, r.Sum)

	// Two requests in flight, answered in order.
	require.NoError(t, c.send(testAdd{A: 1, B: 1}))
	require.NoError(t, c.send(testAdd{A: 2, B: 2}))
	r1, err1 := c.recv()
	r2, err2 := c.recv()
	require.NoError(t, errors.Join(err1, err2))
	require.Equal(t, []int{2, 4}, []int{r1.Sum, r2.Sum})

	_, err = c.call(testMul{A: 2, B: 3})
	require.ErrorContains(t, err, "no bench.testMul here", "a handler's error comes back as an error")
	_, err = c.call(testOff{})
	require.ErrorContains(t, err, "not a request of this protocol", "refused before it is sent")
	r, err = c.call(testAdd{A: 4, B: 5})
	require.NoError(t, err, "the child goes on after an error")
	require.Equal(t, 9, r.Sum)

	c.quit()
	require.True(t, c.cmd.ProcessState.Success(), "quit ends the child cleanly")
}

func TestChildRejectsAnUnknownRequest(t *testing.T) {
	_, err := testRequests.decode(requestLine{Type: "testOff", Body: []byte("{}")})
	require.ErrorContains(t, err, `unknown request "testOff"`)
	l, err := testRequests.encode(testMul{A: 6, B: 7})
	require.NoError(t, err)
	q, err := testRequests.decode(l)
	require.NoError(t, err)
	require.Equal(t, testMul{A: 6, B: 7}, q)
}
