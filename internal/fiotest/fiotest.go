// Package fiotest reads fio's JSON output back in tests that run fio.
package fiotest

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// CheckVerify judges the --output-format=json output of one
// group-reported fio verify job (writes, then reads that check them): nil
// when fio reported no error and wrote and verified want bytes each. Text
// fio prints before the JSON (warnings) is skipped.
func CheckVerify(out []byte, want int64) error {
	var res struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"read"`
			Write struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	i := bytes.IndexByte(out, '{')
	if i < 0 {
		return fmt.Errorf("fio output holds no JSON:\n%s", out)
	}
	if err := json.Unmarshal(out[i:], &res); err != nil {
		return fmt.Errorf("fio output: %w\n%s", err, out)
	}
	if len(res.Jobs) != 1 {
		return fmt.Errorf("fio output: %d job groups, want 1 (--group_reporting)", len(res.Jobs))
	}
	if j := res.Jobs[0]; j.Error != 0 || j.Write.IOBytes != want || j.Read.IOBytes != want {
		return fmt.Errorf("fio: error %d, wrote %d, verified %d bytes; want error 0 and %d bytes each",
			j.Error, j.Write.IOBytes, j.Read.IOBytes, want)
	}
	return nil
}
