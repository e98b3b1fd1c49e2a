// Package testleak holds the goroutine-leak checks' exceptions, each a
// library's leak named once with its reason, for every package whose tests
// check for leaks (go.uber.org/goleak). It owns nothing else.
package testleak

import "go.uber.org/goleak"

// ZMQPubWriter: zmq4 v0.17.0 never ends a PUB socket's writer goroutine
// (its socket Close does not close the writer): one goroutine per PUB
// socket (KV events publishers), a library leak, not ours.
var ZMQPubWriter = goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run")

// VerifyTestMain is goleak.VerifyTestMain with the known library leaks
// ignored.
func VerifyTestMain(m goleak.TestingM) { goleak.VerifyTestMain(m, ZMQPubWriter) }
