//! Frame prefix and header shape on arbitrary byte streams: `FrameCodec` (what `FrameReader` decodes its buffer
//! with) fed whole and in arbitrary chunks, `read_shape` + `skip` (the data plane's step-by-step reader), and the
//! hello handshake's frame reader on both sides (`hello::answer`, `hello::open`).
//!
//! Input: byte 0 picks the connection limit, bytes 1..9 the chunking pattern, the rest is the stream.
//! Properties: no panic; chunked decoding yields the same frames and the same outcome as whole decoding; each
//! frame re-encodes to exactly the bytes it came from (prefix via `frame_prefix`); `read_shape` agrees with the
//! codec frame by frame and refuses where it refuses; a hello that `answer` accepts negotiates.
#![no_main]

use bytes::{Bytes, BytesMut};
use crescent_fuzz::{Chunked, block_on, write_seeds};
use crescent_net::auth::{Keyring, Plane};
use crescent_net::frame::{ShapeError, read_shape, skip};
use crescent_net::hello::{self, Verifier};
use crescent_net::host::NodeKeys;
use crescent_proto::transfer::TransferRequest;
use crescent_proto::wire::{
    FRAME_PREFIX, Frame, FrameCodec, Head, Hello, HelloReply, Limits, MAX_HELLO_FRAME, PeerRole, frame_prefix,
};
use crescent_proto::{ClientId, MasterRequest, Principal, SegmentId};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;
use tokio_util::codec::{Decoder, Encoder};

const LIMITS: [u32; 5] = [0, 16, 1024, MAX_HELLO_FRAME as u32, Limits::CONTROL.max_frame];

/// Decodes every frame of `stream`, handing it to the codec `chunk` bytes at a time; the frames, and whether
/// decoding stopped on an error.
fn decode_all(max: u32, stream: &[u8], mut chunk: impl FnMut() -> usize) -> (Vec<Frame>, bool) {
    let mut codec = FrameCodec::new(Limits { max_frame: max });
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut fed = 0;
    loop {
        match codec.decode(&mut buf) {
            Ok(Some(f)) => frames.push(f),
            Ok(None) if fed == stream.len() => return (frames, false),
            Ok(None) => {
                let n = chunk().min(stream.len() - fed);
                buf.extend_from_slice(&stream[fed..fed + n]);
                fed += n;
            }
            Err(_) => return (frames, true),
        }
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let client = ClientId::random();
    let frames = [
        Frame::encode(1, &MasterRequest::Ping { client }, Bytes::new()).unwrap(),
        Frame::encode(2, &MasterRequest::ClusterInfo, Bytes::from_static(b"payload")).unwrap(),
        Frame::encode(0, &Hello::new(PeerRole::Client, Some(client)), Bytes::new()).unwrap(),
        Frame::encode(
            0,
            &HelloReply::Ok(Hello::new(PeerRole::Node, None).negotiate(Limits::DATA).unwrap()),
            Bytes::new(),
        )
        .unwrap(),
    ];
    let mut wire = BytesMut::new();
    let mut codec = FrameCodec::new(Limits::CONTROL);
    let mut out = Vec::new();
    for f in &frames {
        let mut one = BytesMut::new();
        codec.encode(f.clone(), &mut one).unwrap();
        wire.extend_from_slice(&one);
        for limit in [2u8, 4] {
            let mut s = vec![limit, 0x31, 0x42, 0x13, 0x24, 0x35, 0x46, 0x57, 0x68];
            s.extend_from_slice(&one);
            out.push(s);
        }
    }
    let mut all = vec![4u8, 0xf0, 0, 0, 0, 0, 0, 0, 0];
    all.extend_from_slice(&wire);
    out.push(all);
    let read = TransferRequest::Read { segment: SegmentId::random(), offset: 4096, length: 1 << 20, grant: None };
    let mut data = vec![3u8, 0x77, 0, 0, 0, 0, 0, 0, 0];
    data.extend_from_slice(Head::encode(7, &read, 3).unwrap().as_bytes());
    data.extend_from_slice(b"xyz");
    out.push(data);
    out
}

fuzz_target!(init: write_seeds(seeds), |data: &[u8]| {
    let (limit, rest) = crescent_fuzz::split_first(data);
    let max = LIMITS[limit as usize % LIMITS.len()];
    let (pattern, stream) = if rest.len() >= 8 {
        let (p, s) = rest.split_at(8);
        (u64::from_le_bytes(p.try_into().unwrap()), s)
    } else {
        (0, rest)
    };

    // Whole, then in chunks: the same frames and the same outcome.
    let (frames, failed) = decode_all(max, stream, || stream.len());
    let mut cutter = Chunked::new(&[], pattern);
    let chunked = decode_all(max, stream, || cutter.next_chunk());
    assert_eq!(chunked, (frames.clone(), failed), "chunking changed what the codec decoded");

    // Each frame re-encodes to its own bytes.
    let mut codec = FrameCodec::new(Limits { max_frame: max });
    let mut wire = BytesMut::new();
    for f in &frames {
        let start = wire.len();
        codec.encode(f.clone(), &mut wire).expect("a decoded frame re-encodes under the same limit");
        let prefix = frame_prefix(f.header.len(), f.payload.len()).unwrap();
        assert_eq!(&wire[start..start + FRAME_PREFIX], &prefix[..]);
        let _ = f.request_id();
    }
    assert_eq!(&wire[..], &stream[..wire.len()], "frames re-encode to the bytes they came from");

    // read_shape + skip: the same shapes, and a refusal where the codec refused.
    let mut reader = Chunked::new(stream, pattern);
    block_on(async {
        for f in &frames {
            let shape = match read_shape(&mut reader, max as usize).await {
                Ok(s) => s,
                Err(_) => panic!("read_shape refused a frame the codec accepted"),
            };
            assert_eq!((shape.header_len, shape.payload_len), (f.header.len(), f.payload.len()));
            skip(&mut reader, shape.header_len + shape.payload_len).await.unwrap();
        }
        match read_shape(&mut reader, max as usize).await {
            Err(ShapeError::Wire(_)) => assert!(failed, "read_shape refused what the codec waits on"),
            Err(ShapeError::Io(_)) => assert!(!failed && reader.remaining() == 0),
            Ok(_) => assert!(!failed),
        }
    });

    // The hello readers, server side (without authentication, as the master with the secret, as a host with its
    // own keys) and client side (without and with a credential), over the same stream.
    let ring = Keyring::parse("a fuzzing cluster secret").unwrap();
    let host = NodeKeys::fixed(ring.credential(Principal::Node(None)));
    let verifiers = [
        (Plane::Control, None),
        (Plane::Control, Some(Verifier::Secret(&ring))),
        (Plane::Data, Some(Verifier::Host(&host))),
    ];
    for (plane, verifier) in verifiers {
        let authenticates = verifier.is_some();
        let mut io = Chunked::new(stream, pattern);
        if let Ok(Some(a)) = block_on(hello::answer(&mut io, plane, Limits::CONTROL, Duration::from_secs(10), verifier)) {
            assert!(a.hello.negotiate(Limits::CONTROL).is_ok(), "answer accepted a hello that does not negotiate");
            assert!(!io.written.is_empty(), "an accepted hello is answered");
            assert_eq!(a.principal.is_some(), authenticates, "an authenticating server admits only the proven");
        }
    }
    let credential = ring.credential(Principal::Admin);
    for credential in [None, Some(&credential)] {
        let mut io = Chunked::new(stream, pattern);
        let _ = block_on(hello::open(&mut io, Plane::Control, PeerRole::Client, None, credential));
    }
});
