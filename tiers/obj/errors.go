package obj

import (
	"context"
	"errors"
	"net"
	"net/http"
	"syscall"

	"github.com/minio/minio-go/v7"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

// class is what an S3 call's outcome means for the tier.
type class uint8

const (
	classOK          class = iota
	classNotFound          // the object is not there
	classInvalid           // the object is there but fails validation
	classTransient         // worth retrying after a backoff
	classUnreachable       // the endpoint is down or refuses us: the tier is unhealthy
	classPermanent         // this call will not succeed; the tier is fine
)

// classify sorts an error from a Client call or from block validation.
func classify(err error) class {
	var resp minio.ErrorResponse
	var netErr net.Error
	switch {
	case err == nil:
		return classOK
	case errors.Is(err, messages.ErrInvalidBlock), errors.Is(err, messages.ErrChecksum):
		return classInvalid
	case errors.Is(err, blockfmt.ErrSize):
		// NB: a sound object read into a destination of another length:
		// the caller's error, the copy kept, nothing worth a retry.
		return classPermanent
	case errors.Is(err, messages.ErrNotFound):
		return classNotFound
	case errors.Is(err, ErrNoBucket), errors.Is(err, ErrAccessDenied), // refused credentials fail every call
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), isDNSError(err):
		return classUnreachable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, errShortBody):
		return classTransient
	case errors.As(err, &netErr):
		return classTransient
	case errors.As(err, &resp) && resp.StatusCode != 0:
		switch {
		case resp.StatusCode == http.StatusUnauthorized, resp.StatusCode == http.StatusForbidden:
			return classUnreachable // bad credentials fail every call: shed, probe
		case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusRequestTimeout,
			resp.StatusCode >= 500:
			return classTransient
		}
		return classPermanent
	}
	return classTransient
}

func isDNSError(err error) bool {
	var dns *net.DNSError
	return errors.As(err, &dns) && !dns.IsTimeout && !dns.IsTemporary
}
