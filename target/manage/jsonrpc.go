package manage

import (
	"bytes"
	"encoding/json"
)

// Request is a JSON-RPC 2.0 request.
type Request struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
}

// Response is a JSON-RPC 2.0 response: Result or Error.
type Response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

// MaxRequestBytes bounds a request's body.
const MaxRequestBytes = 1 << 20

// DecodeRequest parses one request: a JSON object with "jsonrpc": "2.0", a
// method, an id that is a number, a string or null, and params that are an
// object or absent. Anything else is a parse error (not JSON) or an
// invalid request, whose message says what is wrong. Unknown members are
// refused, as a misspelt one would otherwise pass unnoticed.
func DecodeRequest(b []byte) (Request, *Error) {
	var req Request
	if !json.Valid(b) {
		return req, Errorf(CodeParseError, "parse error: the request is not valid JSON")
	}
	t := bytes.TrimLeft(b, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return req, Errorf(CodeInvalidRequest, "invalid request: want one JSON object (batches are not supported)")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, Errorf(CodeInvalidRequest, "invalid request: %v", err)
	}
	req.ID = bytes.TrimSpace(req.ID)
	switch {
	case req.JSONRPC != "2.0":
		return req, Errorf(CodeInvalidRequest, "invalid request: \"jsonrpc\" is %q, want \"2.0\"", req.JSONRPC)
	case req.Method == "":
		return req, Errorf(CodeInvalidRequest, "invalid request: no method")
	case len(req.ID) > 0 && req.ID[0] != '"' && req.ID[0] != '-' && (req.ID[0] < '0' || req.ID[0] > '9') && string(req.ID) != "null":
		return req, Errorf(CodeInvalidRequest, "invalid request: the id %s is not a number, a string or null", req.ID)
	}
	if p := bytes.TrimSpace(req.Params); len(p) > 0 && p[0] != '{' && string(p) != "null" {
		return req, Errorf(CodeInvalidRequest, "invalid request: params are %s, want an object", kindOf(p))
	}
	return req, nil
}

func kindOf(v []byte) string {
	switch v[0] {
	case '[':
		return "an array"
	case '"':
		return "a string"
	}
	return "not an object"
}

// DecodeParams decodes a request's params into v, refusing unknown members
// and values of the wrong type (invalid params).
func DecodeParams(raw json.RawMessage, v any) *Error {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Errorf(CodeInvalidParams, "invalid params: %v", err)
	}
	if dec.More() {
		return Errorf(CodeInvalidParams, "invalid params: trailing data")
	}
	return nil
}
