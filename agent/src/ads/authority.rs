//! A front for each connection on the Unix socket that makes the `:authority` of gRPC C-core
//! clients acceptable to the HTTP/2 server underneath tonic.
//!
//! gRPC C-core (Python, C++, Ruby… clients) sends the percent-encoded socket path as the
//! `:authority` of every request on a `unix:///path` channel (`var%2Frun%2Fpasa%2Fxds.sock`).
//! The `h2` crate refuses an authority that is not RFC 3986 host syntax and resets the stream
//! with PROTOCOL_ERROR, so those clients could never open an ADS stream. Envoy names its cluster
//! instead, and Go clients send `localhost`, which is why Istio's agent (a Go server) never sees
//! the problem.
//!
//! The front forwards the client's bytes frame by frame. Header blocks (HEADERS and their
//! CONTINUATION frames) are decoded with the client's HPACK state, an unacceptable `:authority`
//! becomes `localhost`, and the block is re-encoded as literals that never touch the server's
//! dynamic table; every other frame, and everything the server sends, passes unchanged.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::UnixStream;

/// The connection preface every HTTP/2 client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
/// The largest frame payload a peer must accept before settings say otherwise.
const MAX_FRAME: usize = 16_384;
/// Buffer between the front and the server, per direction.
const PIPE: usize = 64 * 1024;
/// Largest header block accepted (gRPC's default metadata limit is 8 KiB; this is generous).
const MAX_HEADER_BLOCK: usize = 256 * 1024;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// What the authority of a request becomes when the client's is unusable.
const LOCAL_AUTHORITY: &[u8] = b"localhost";

/// The server side of a fronted connection: what tonic serves.
#[derive(Debug)]
pub struct Fronted(DuplexStream);

impl tonic::transport::server::Connected for Fronted {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Fronted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Fronted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Puts the front before `client`; the returned stream is the connection as the server sees it.
/// Both directions run on their own tasks until either side closes.
pub fn front(client: UnixStream) -> Fronted {
    let (server_side, front_side) = tokio::io::duplex(PIPE);
    let (client_read, mut client_write) = client.into_split();
    let (mut front_read, front_write) = tokio::io::split(front_side);
    tokio::spawn(async move {
        if let Err(e) = pump(client_read, front_write).await {
            tracing::debug!(error = %e, "client connection ended");
        }
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut front_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
    Fronted(server_side)
}

/// Copies the client's frames to the server, rewriting header blocks (the client-to-server half
/// of [`front`]).
pub async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
) -> io::Result<()> {
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if preface != PREFACE {
        // Not HTTP/2 with prior knowledge: let the server answer it as it would.
        return tokio::io::copy(&mut from, &mut to).await.map(|_| ());
    }
    let mut decoder = loona_hpack::Decoder::new();
    // A header block being collected: its stream, first-frame flags, priority bytes, fragment.
    let mut pending: Option<(u32, u8, Vec<u8>, Vec<u8>)> = None;
    let mut header = [0u8; FRAME_HEADER];
    loop {
        match from.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let kind = header[3];
        let flags = header[4];
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        match kind {
            HEADERS => {
                let (priority, fragment) = headers_fragment(flags, &payload)?;
                pending = Some((stream, flags, priority, fragment));
            }
            CONTINUATION => match &mut pending {
                Some((s, _, _, fragment)) if *s == stream => {
                    fragment.extend_from_slice(&payload);
                    if fragment.len() > MAX_HEADER_BLOCK {
                        return Err(invalid("header block too large"));
                    }
                }
                _ => return Err(invalid("CONTINUATION without HEADERS")),
            },
            _ => {
                if pending.is_some() {
                    return Err(invalid("frame inside a header block"));
                }
                to.write_all(&header).await?;
                to.write_all(&payload).await?;
                continue;
            }
        }
        if flags & END_HEADERS == 0 {
            continue;
        }
        let Some((stream, first_flags, priority, fragment)) = pending.take() else {
            continue;
        };
        let block = rewrite(&mut decoder, &fragment)?;
        write_headers(&mut to, stream, first_flags, &priority, &block).await?;
    }
}

/// The priority bytes and header block fragment of a HEADERS payload, without padding.
fn headers_fragment(flags: u8, payload: &[u8]) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut body = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = body
            .split_first()
            .ok_or_else(|| invalid("empty padded HEADERS"))?;
        pad = n as usize;
        body = rest;
    }
    let mut priority = Vec::new();
    if flags & PRIORITY != 0 {
        if body.len() < 5 {
            return Err(invalid("short HEADERS priority"));
        }
        priority = body[..5].to_vec();
        body = &body[5..];
    }
    if pad > body.len() {
        return Err(invalid("HEADERS padding longer than the frame"));
    }
    Ok((priority, body[..body.len() - pad].to_vec()))
}

/// Decodes a header block and encodes it again, with an acceptable `:authority`.
fn rewrite(decoder: &mut loona_hpack::Decoder<'_>, fragment: &[u8]) -> io::Result<Vec<u8>> {
    let headers = decoder
        .decode(fragment)
        .map_err(|e| invalid(&format!("undecodable header block: {e:?}")))?;
    let mut out = Vec::with_capacity(fragment.len() * 2);
    for (name, value) in headers {
        let value = if name == b":authority" && !acceptable_authority(&value) {
            LOCAL_AUTHORITY.to_vec()
        } else {
            value
        };
        // Literal header field without indexing, new name (RFC 7541 §6.2.2), no Huffman.
        out.push(0);
        encode_string(&name, &mut out);
        encode_string(&value, &mut out);
    }
    Ok(out)
}

fn acceptable_authority(value: &[u8]) -> bool {
    std::str::from_utf8(value).is_ok_and(|s| s.parse::<http::uri::Authority>().is_ok())
}

/// An HPACK string literal: length as a 7-bit-prefix integer, then the raw octets.
fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    let mut n = s.len();
    if n < 127 {
        out.push(n as u8);
    } else {
        out.push(127);
        n -= 127;
        while n >= 128 {
            out.push((n % 128) as u8 | 0x80);
            n /= 128;
        }
        out.push(n as u8);
    }
    out.extend_from_slice(s);
}

/// Writes a header block as HEADERS (+ CONTINUATION) frames no larger than the default maximum.
async fn write_headers(
    to: &mut (impl AsyncWrite + Unpin),
    stream: u32,
    first_flags: u8,
    priority: &[u8],
    block: &[u8],
) -> io::Result<()> {
    let room = MAX_FRAME - priority.len();
    let (first, mut rest) = block.split_at(block.len().min(room));
    let mut flags = first_flags & (END_STREAM | PRIORITY);
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    let mut payload = priority.to_vec();
    payload.extend_from_slice(first);
    write_frame(to, HEADERS, flags, stream, &payload).await?;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        write_frame(to, CONTINUATION, flags, stream, chunk).await?;
    }
    Ok(())
}

async fn write_frame(
    to: &mut (impl AsyncWrite + Unpin),
    kind: u8,
    flags: u8,
    stream: u32,
    payload: &[u8],
) -> io::Result<()> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut header = [0u8; FRAME_HEADER];
    header[..3].copy_from_slice(&len[1..]);
    header[3] = kind;
    header[4] = flags;
    header[5..].copy_from_slice(&stream.to_be_bytes());
    to.write_all(&header).await?;
    to.write_all(payload).await
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames `payload` as one HTTP/2 frame.
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        out.extend([kind, flags]);
        out.extend(stream.to_be_bytes());
        out.extend(payload);
        out
    }

    fn parse_frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        out
    }

    async fn through_front(input: Vec<u8>) -> Vec<u8> {
        let (mut out_write, mut out_read) = tokio::io::duplex(1 << 20);
        let pumping = tokio::spawn(async move { pump(input.as_slice(), &mut out_write).await });
        let mut received = Vec::new();
        out_read.read_to_end(&mut received).await.unwrap();
        pumping.await.unwrap().unwrap();
        received
    }

    #[tokio::test]
    async fn a_socket_path_authority_becomes_localhost_and_the_rest_passes() {
        // What gRPC C-core sends: Huffman and dynamic-table entries from the hpack encoder.
        let mut encoder = loona_hpack::Encoder::new();
        let request: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (
                b":path",
                b"/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
            ),
            (b":authority", b"var%2Frun%2Fpasa%2Fxds.sock"),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
        ];
        let first = encoder.encode(request.iter().copied());
        // A second request that reuses the client's dynamic table.
        let second = encoder.encode(request.iter().copied());
        let (head, tail) = first.split_at(10);
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        input.extend(frame(
            HEADERS,
            PADDED,
            1,
            &[[2u8].as_slice(), head, &[0, 0]].concat(),
        ));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, tail));
        input.extend(frame(0x0, END_STREAM, 1, b"data"));
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &second));

        let output = through_front(input).await;
        assert!(output.starts_with(PREFACE));
        let frames = parse_frames(&output[PREFACE.len()..]);
        assert_eq!(frames.len(), 4, "{frames:?}");
        assert_eq!(frames[0].0, 0x4);
        let mut server = loona_hpack::Decoder::new();
        for (i, stream) in [(1usize, 1u32), (3, 3)] {
            let (kind, flags, s, block) = &frames[i];
            assert_eq!((*kind, *s), (HEADERS, stream));
            assert_ne!(flags & END_HEADERS, 0);
            assert_eq!(flags & PADDED, 0);
            let headers = server.decode(block).unwrap();
            let authority = headers.iter().find(|(n, _)| n == b":authority").unwrap();
            assert_eq!(authority.1, b"localhost");
            assert_eq!(headers.len(), 6);
        }
        assert_eq!(frames[1].1 & END_STREAM, 0);
        assert_ne!(frames[3].1 & END_STREAM, 0);
        assert_eq!(
            (frames[2].0, frames[2].3.as_slice()),
            (0x0, b"data".as_slice())
        );
    }

    #[tokio::test]
    async fn a_valid_authority_is_kept_and_large_blocks_are_split() {
        let mut encoder = loona_hpack::Encoder::new();
        let big = vec![b'x'; 40_000];
        let block = encoder.encode(vec![
            (b":authority".as_slice(), b"localhost:15010".as_slice()),
            (b"x-big".as_slice(), big.as_slice()),
        ]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        let output = through_front(input).await;
        let frames = parse_frames(&output[PREFACE.len()..]);
        assert!(frames.len() >= 3);
        assert!(frames[1..].iter().all(|f| f.0 == CONTINUATION));
        let joined: Vec<u8> = frames.iter().flat_map(|f| f.3.clone()).collect();
        let headers = loona_hpack::Decoder::new().decode(&joined).unwrap();
        assert_eq!(headers[0].1, b"localhost:15010");
        assert_eq!(headers[1].1.len(), 40_000);
    }

    #[tokio::test]
    async fn garbage_inside_a_header_block_ends_the_connection() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]));
        let (mut out_write, _out_read) = tokio::io::duplex(1 << 16);
        assert!(pump(input.as_slice(), &mut out_write).await.is_err());
    }
}
