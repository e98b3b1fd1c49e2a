package messages

// Ack answers requests that return only an error.
type Ack struct {
	Corr uint64 // from the request
	Err  error  // nil on success
}
