package proclog

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestWaitJSONFindsARecordWrittenInPieces(t *testing.T) {
	l := New()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		fmt.Fprint(l, "kvtierd v1 (rev x)\n{\"message\":\"other\"}\n{\"level\":\"info\",")
		time.Sleep(10 * time.Millisecond)
		fmt.Fprint(l, "\"message\":\"kvtierd listening\",\"pool_path\":\"/p\"}\ntail")
	}()
	rec, err := l.WaitJSON(ctx, "kvtierd listening")
	if err != nil {
		t.Fatal(err)
	}
	if rec["pool_path"] != "/p" {
		t.Errorf("record %v, want pool_path /p", rec)
	}
	want := "kvtierd v1 (rev x)\n{\"message\":\"other\"}\n{\"level\":\"info\",\"message\":\"kvtierd listening\",\"pool_path\":\"/p\"}\ntail"
	if got := l.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestWaitJSONIgnoresAnUnfinishedLine(t *testing.T) {
	l := New()
	fmt.Fprint(l, `{"message":"m"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.WaitJSON(ctx, "m"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a line without its newline: err %v, want the deadline", err)
	}
	fmt.Fprintln(l)
	if _, err := l.WaitJSON(context.Background(), "m"); err != nil {
		t.Fatal(err)
	}
}

func TestWaitJSONEndsWithTheContextsCause(t *testing.T) {
	l := New()
	exited := errors.New("process exited")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(exited)
	if _, err := l.WaitJSON(ctx, "m"); !errors.Is(err, exited) {
		t.Fatalf("err %v, want the cause", err)
	}
}
