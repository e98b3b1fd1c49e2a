package obj

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/assert"
)

// Refused credentials make the tier unreachable (shed, probed), whatever
// the status S3 answers them with: an expired session token is a 400
// (ExpiredToken), which would otherwise fail one call at a time for ever.
func TestRefusedCredentialsMakeTheTierUnreachable(t *testing.T) {
	for _, resp := range []minio.ErrorResponse{
		{StatusCode: http.StatusForbidden, Code: "AccessDenied"},
		{StatusCode: http.StatusBadRequest, Code: "ExpiredToken"},
		{StatusCode: http.StatusBadRequest, Code: "InvalidToken"},
		{StatusCode: http.StatusUnauthorized},
	} {
		err := wrap("get", "k", resp)
		assert.ErrorIs(t, err, ErrAccessDenied, resp.Code)
		assert.Equal(t, classUnreachable, classify(err), "%d %s", resp.StatusCode, resp.Code)
	}
	other := wrap("get", "k", minio.ErrorResponse{StatusCode: http.StatusBadRequest, Code: "InvalidArgument"})
	assert.Equal(t, classPermanent, classify(other), "a bad request is this call's")
	assert.False(t, errors.Is(other, ErrAccessDenied))
	assert.Equal(t, classUnreachable, classify(fmt.Errorf("put: %w", ErrAccessDenied)))
}
