package manage

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Client calls a target's management API.
type Client struct {
	endpoint string // for errors
	url      string
	hc       *http.Client
	token    string
	ids      atomic.Int64
}

// Dial makes a client of the endpoint: "unix:PATH", "unix://PATH" or a path
// with a slash for the unix socket, else "HOST:PORT" (or "tcp://HOST:PORT")
// for TCP, whose token is read from tokenFile (ReadTokenFile). Nothing is
// sent until the first call.
func Dial(endpoint, tokenFile string) (*Client, error) {
	if path, ok := unixPath(endpoint); ok {
		c := &Client{endpoint: endpoint, url: "http://unix/rpc"}
		c.hc = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", path)
			},
		}}
		return c, nil
	}
	addr := strings.TrimPrefix(endpoint, "tcp://")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("management endpoint %q: want unix:PATH or HOST:PORT (%v)", endpoint, err)
	}
	c := &Client{endpoint: endpoint, url: "http://" + addr + "/rpc", hc: &http.Client{}}
	if tokenFile != "" {
		tok, err := ReadTokenFile(tokenFile)
		if err != nil {
			return nil, err
		}
		c.token = tok
	}
	return c, nil
}

func unixPath(endpoint string) (string, bool) {
	if strings.HasPrefix(endpoint, "tcp://") {
		return "", false
	}
	if p, ok := strings.CutPrefix(endpoint, "unix://"); ok {
		return p, true
	}
	if p, ok := strings.CutPrefix(endpoint, "unix:"); ok {
		return p, true
	}
	return endpoint, strings.Contains(endpoint, "/")
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Call sends method with params and decodes the result into result (nil:
// ignored). A refusal is an *Error (errors.Is finds its kind); a failure to
// reach the target says so with the endpoint.
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	var raw json.RawMessage
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return err
		}
		raw = b
	}
	id := c.ids.Add(1)
	body, err := json.Marshal(Request{JSONRPC: "2.0", ID: json.RawMessage(strconv.FormatInt(id, 10)), Method: method, Params: raw})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("management API at %s: %w", c.endpoint, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("management API at %s: %w", c.endpoint, err)
	}
	var r Response
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("management API at %s: HTTP %s, not a JSON-RPC response: %.200q", c.endpoint, resp.Status, b)
	}
	if r.Error != nil {
		return r.Error
	}
	if string(r.ID) != strconv.FormatInt(id, 10) {
		return fmt.Errorf("management API at %s: the response's id %s is not the request's %d", c.endpoint, r.ID, id)
	}
	if result != nil {
		if err := json.Unmarshal(r.Result, result); err != nil {
			return fmt.Errorf("management API at %s: %s result: %w", c.endpoint, method, err)
		}
	}
	return nil
}

// DefaultTimeout bounds a call whose context has no deadline.
const DefaultTimeout = 2 * time.Minute

func (c *Client) call(ctx context.Context, method string, params, result any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	return c.Call(ctx, method, params, result)
}

// Inventory lists the subsystems, namespaces and capacity.
func (c *Client) Inventory(ctx context.Context) (Inventory, error) {
	var inv Inventory
	err := c.call(ctx, MethodGetSubsystems, nil, &inv)
	return inv, err
}

// CreateSubsystem creates a subsystem.
func (c *Client) CreateSubsystem(ctx context.Context, p CreateSubsystemParams) (SubsystemInfo, error) {
	var s SubsystemInfo
	err := c.call(ctx, MethodCreateSubsystem, p, &s)
	return s, err
}

// DeleteSubsystem deletes a subsystem.
func (c *Client) DeleteSubsystem(ctx context.Context, p DeleteSubsystemParams) error {
	return c.call(ctx, MethodDeleteSubsystem, p, nil)
}

// AddHost allows a host on a subsystem.
func (c *Client) AddHost(ctx context.Context, p HostParams) error {
	return c.call(ctx, MethodAddHost, p, nil)
}

// RemoveHost removes a host from a subsystem's allow-list.
func (c *Client) RemoveHost(ctx context.Context, p HostParams) error {
	return c.call(ctx, MethodRemoveHost, p, nil)
}

// AddNamespace creates a namespace.
func (c *Client) AddNamespace(ctx context.Context, p AddNamespaceParams) (NamespaceInfo, error) {
	var n NamespaceInfo
	err := c.call(ctx, MethodAddNamespace, p, &n)
	return n, err
}

// ResizeNamespace grows a namespace.
func (c *Client) ResizeNamespace(ctx context.Context, p ResizeNamespaceParams) (NamespaceInfo, error) {
	var n NamespaceInfo
	err := c.call(ctx, MethodResizeNamespace, p, &n)
	return n, err
}

// RemoveNamespace deletes a namespace.
func (c *Client) RemoveNamespace(ctx context.Context, p RemoveNamespaceParams) error {
	return c.call(ctx, MethodRemoveNamespace, p, nil)
}
